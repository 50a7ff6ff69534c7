// torch/extension.h as a load_inline kernel file sees it first (env_pool/build/nvcc_light.py): torch's
// tensor API (torch::Tensor, ATen's ops, TORCH_CHECK, the dispatch macros) without its whole C++
// frontend and pybind11, which nvcc would otherwise parse three times. A file that needs more
// is built against the real header, in parallel; the binding's main.cpp always gets the real one.
#pragma once
#include <torch/types.h>
