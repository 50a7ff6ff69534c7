"""Swish, KernelBench style: the kernel is built with torch.utils.cpp_extension.load_inline.

Slow to build (~40 s on a 2-core machine): the torch headers, not the kernel, cost the time.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor swish_forward(torch::Tensor x) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "swish_forward: float32 only");
    TORCH_CHECK(x.is_contiguous(), "swish_forward: contiguous input only");
    auto y = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) {
        const float v = xp[i];
        yp[i] = v / (1.0f + std::exp(-v));
    }
    return y;
}
"""

_ext = load_inline(
    name="env_corpus_swish_ext",
    cpp_sources=_cpp_source,
    functions=["swish_forward"],
    extra_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.swish_forward(x.contiguous())
