"""GELU, KernelBench style, that asks the device for its SM count at import (to size its grid).

Its import needs the GPU: the environment builds load_inline solutions without it, then imports
this one again with the device, holding the timing lane (env_pool/evaluate.py, _import_step).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    for (; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
}

torch::Tensor gelu_forward(torch::Tensor x, int64_t max_blocks) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "gelu_forward: float32 CUDA tensors only");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t n = xc.numel();
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, max_blocks);
    gelu_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

_cpp_source = "torch::Tensor gelu_forward(torch::Tensor x, int64_t max_blocks);"

_ext = load_inline(name="env_corpus_gelu_inline_sm_count_cuda", cpp_sources=_cpp_source, cuda_sources=_cuda_source,
                   functions=["gelu_forward"], extra_cuda_cflags=["-O3"], verbose=False)


_MAX_BLOCKS = torch.cuda.get_device_properties(0).multi_processor_count * 8  # at import: needs the device


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.gelu_forward(x, _MAX_BLOCKS)
