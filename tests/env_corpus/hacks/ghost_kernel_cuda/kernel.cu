// A real, fast GELU kernel (float4 loads, erff): compiled, loaded and never launched. The decoy.
// Exact GELU, one thread per element, 4 elements per thread through float4 loads.
#include <cstdint>
#include <cuda_runtime.h>
#include <math.h>

__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

__global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i + 3 < n) {
    float4 v = *reinterpret_cast<const float4*>(x + i);
    v.x = gelu(v.x); v.y = gelu(v.y); v.z = gelu(v.z); v.w = gelu(v.w);
    *reinterpret_cast<float4*>(y + i) = v;
  } else {
    for (; i < n; ++i) y[i] = gelu(x[i]);
  }
}

extern "C" int gelu_forward(const float* x, float* y, int64_t n, void* stream) {
  int threads = 256;
  int64_t blocks = (n / 4 + threads) / threads;
  gelu_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(x, y, n);
  return static_cast<int>(cudaGetLastError());
}
