// Row softmax WITHOUT the max subtraction: expf overflows to inf for inputs above ~88, and the row
// becomes NaN. The task's own inputs never get near that; the adversarial sets' large ones do.
// Same launcher as legit/softmax_warp_cuda, whose model_new.py this case reuses.
#include <cstdint>
#include <cuda_runtime.h>
#include <math.h>

constexpr int kThreads = 256;

__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
  const float* row = x + blockIdx.x * cols;
  float* out = y + blockIdx.x * cols;
  __shared__ float partial[kThreads];
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) s += expf(row[j]);
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  float inv = 1.f / partial[0];
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) out[j] = expf(row[j]) * inv;
}

extern "C" int softmax_forward(const float* x, float* y, int64_t rows, int64_t cols, void* stream) {
  softmax_rows<<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, y, cols);
  return static_cast<int>(cudaGetLastError());
}
