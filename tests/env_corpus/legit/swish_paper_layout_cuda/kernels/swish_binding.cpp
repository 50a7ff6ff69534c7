// The binding: checks the input, allocates the output, launches on torch's current stream;
// registered with the module through the environment's binding registry.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include "../binding_registry.h"

extern "C" void swish_launcher(float* out, const float* x, int64_t n, cudaStream_t stream);

static torch::Tensor swish_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "swish_forward: a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "swish_forward: float32 only");
    TORCH_CHECK(x.is_contiguous(), "swish_forward: contiguous input only");
    auto out = torch::empty_like(x);
    swish_launcher(out.data_ptr<float>(), x.data_ptr<float>(), x.numel(), c10::cuda::getCurrentCUDAStream().stream());
    return out;
}

static void register_swish(pybind11::module& m) { m.def("swish_forward", &swish_forward, py::arg("x")); }

REGISTER_BINDING(swish, register_swish);
