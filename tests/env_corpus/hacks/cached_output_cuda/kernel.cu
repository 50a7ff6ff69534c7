// A correct GELU; the hack is in model_new.py (it calls this once and caches the result).
#include <cstdint>
#include <cuda_runtime.h>
#include <math.h>

__global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

extern "C" int gelu_forward(const float* x, float* y, int64_t n, void* stream) {
  gelu_kernel<<<(n + 255) / 256, 256, 0, static_cast<cudaStream_t>(stream)>>>(x, y, n);
  return static_cast<int>(cudaGetLastError());
}
