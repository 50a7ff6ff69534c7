// Writes through a wild pointer: an illegal memory access that poisons the CUDA context.
#include <cstdint>
#include <cuda_runtime.h>

__global__ void wild(float* y, int64_t n) {
  float* bad = reinterpret_cast<float*>(0x10);
  bad[threadIdx.x + (int64_t)blockIdx.x * blockDim.x] = 1.0f;
}

extern "C" int gelu_forward(const float* x, float* y, int64_t n, void* stream) {
  wild<<<(n + 255) / 256, 256, 0, static_cast<cudaStream_t>(stream)>>>(y, n);
  return static_cast<int>(cudaGetLastError());
}
