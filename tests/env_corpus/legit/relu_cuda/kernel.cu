// ReLU, one thread per 4 elements through float4 loads and stores.
#include <cstdint>
#include <cuda_runtime.h>

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i + 3 < n) {
    float4 v = *reinterpret_cast<const float4*>(x + i);
    v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
    *reinterpret_cast<float4*>(y + i) = v;
  } else {
    for (; i < n; ++i) y[i] = fmaxf(x[i], 0.f);
  }
}

extern "C" int relu_forward(const float* x, float* y, int64_t n, void* stream) {
  int threads = 256;
  int64_t blocks = (n / 4 + threads) / threads;
  relu_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(x, y, n);
  return static_cast<int>(cudaGetLastError());
}
