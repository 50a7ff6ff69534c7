"""Known solutions for a KernelBench sweep on a GPU: real CUDA kernels, and copies of the reference.

    python scripts/kernelbench_solutions.py --out DIR [--levels 1 2 3] [--kernelbench ../shared/kernelbench]

Writes DIR/levelL/NAME.py (KernelBench's one-file layout, read by ``cuda-agent eval --solutions DIR``):
- level 1's twelve elementwise activations (ReLU ... HardTanh): a ``load_inline`` CUDA kernel each,
  in KernelBench's own form (float4 loads, one kernel, torch/extension.h). They must pass, at
  about eager's speed (memory-bound), faster where eager runs two kernels (Swish, Softsign);
- every other problem: the reference itself as ModelNew. It computes in torch, so the
  environment must refuse it (a torch fallback): these runs give the 250 baselines
  (scripts/compare_baselines.py) and check that a copy of the reference never scores.
"""
from __future__ import annotations

import argparse
from pathlib import Path

# name -> (the elementwise expression of v, with p the module's parameter; ModelNew's __init__ arguments; p from them)
ACTIVATIONS = {
    "19_ReLU": ("fmaxf(v, 0.0f)", "", "0.0"),
    "20_LeakyReLU": ("v > 0.0f ? v : v * p", "negative_slope: float = 0.01", "negative_slope"),
    "21_Sigmoid": ("1.0f / (1.0f + expf(-v))", "", "0.0"),
    "22_Tanh": ("tanhf(v)", "", "0.0"),
    "25_Swish": ("v / (1.0f + expf(-v))", "", "0.0"),
    "26_GELU_": ("0.5f * v * (1.0f + erff(v * 0.70710678118654752f))", "", "0.0"),
    "27_SELU_": ("1.0507009873554805f * (v > 0.0f ? v : 1.6732632423543772f * expm1f(v))", "", "0.0"),
    "28_HardSigmoid": ("fminf(fmaxf(v / 6.0f + 0.5f, 0.0f), 1.0f)", "", "0.0"),
    "29_Softplus": ("v > 20.0f ? v : log1pf(expf(v))", "", "0.0"),
    "30_Softsign": ("v / (1.0f + fabsf(v))", "", "0.0"),
    "31_ELU": ("v > 0.0f ? v : p * expm1f(v)", "alpha: float = 1.0", "alpha"),
    "32_HardTanh": ("fminf(fmaxf(v, -1.0f), 1.0f)", "", "0.0"),
}

KERNEL = r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__device__ __forceinline__ float op(float v, float p) { return EXPR; }

__global__ void op_vec4(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4, float p) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
        float4 v = x[i];
        v.x = op(v.x, p); v.y = op(v.y, p); v.z = op(v.z, p); v.w = op(v.w, p);
        y[i] = v;
    }
}

__global__ void op_tail(const float* __restrict__ x, float* __restrict__ y, int64_t from, int64_t n, float p) {
    const int64_t i = from + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) y[i] = op(x[i], p);
}

torch::Tensor forward(torch::Tensor x, double p) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensors only");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t n = xc.numel();
    const bool aligned = reinterpret_cast<uintptr_t>(xc.data_ptr<float>()) % 16 == 0;
    const int64_t n4 = aligned ? n / 4 : 0;
    auto stream = at::cuda::getCurrentCUDAStream();
    if (n4 > 0) {
        const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
        const int64_t blocks = std::min<int64_t>((n4 + 255) / 256, int64_t(sms) * 32);
        op_vec4<<<blocks, 256, 0, stream>>>(reinterpret_cast<const float4*>(xc.data_ptr<float>()),
                                           reinterpret_cast<float4*>(y.data_ptr<float>()), n4, float(p));
    }
    const int64_t rest = n - n4 * 4;
    if (rest > 0) {
        op_tail<<<(rest + 255) / 256, 256, 0, stream>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n4 * 4, n, float(p));
    }
    return y;
}
"""

cpp_source = "torch::Tensor forward(torch::Tensor x, double p);"

ext = load_inline(name="kb_NAME", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["forward"],
                  extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, ARGS):
        super().__init__()
        self.p = float(PARAM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.forward(x, self.p)
'''


def kernel_solution(name: str) -> str:
    expr, args, param = ACTIVATIONS[name]
    text = KERNEL.replace("EXPR", expr).replace("kb_NAME", f"kb_{name.lower()}").replace("PARAM", param)
    return text.replace("self, ARGS)", f"self, {args})" if args else "self)")


def reference_copy(source: str) -> str:
    return source + "\n\n# A copy of the reference: it computes in torch, and must never score.\nModelNew = Model\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--levels", type=int, nargs="+", default=[1])
    parser.add_argument("--kernelbench", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "kernelbench")
    args = parser.parse_args()
    counts = {"kernel": 0, "reference copy": 0}
    for level in args.levels:
        folder = args.out / f"level{level}"
        folder.mkdir(parents=True, exist_ok=True)
        for problem in sorted((args.kernelbench / f"level{level}").glob("*.py")):
            kind = "kernel" if level == 1 and problem.stem in ACTIVATIONS else "reference copy"
            text = kernel_solution(problem.stem) if kind == "kernel" else reference_copy(problem.read_text())
            (folder / problem.name).write_text(text)
            counts[kind] += 1
    print(f"wrote {counts['kernel']} kernels and {counts['reference copy']} reference copies under {args.out}")


if __name__ == "__main__":
    main()
