// ReLU, deliberately slow (8 full passes over the data, each rewriting y), launched on a
// private non-blocking stream that the launcher returns from at once: the caller's stream has
// nothing to wait for, so a timer that records events on it, or a server that reports "done"
// when forward returns without a device-wide synchronisation, stops the clock before any of the
// work has run. Honestly timed, it is ~8x slower than torch's ReLU.
#include <cstdint>
#include <cuda_runtime.h>
#include <math.h>

__device__ __forceinline__ float gelu(float x) { return fmaxf(x, 0.0f); }  // a ReLU (the task's), under the case's old name

__global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) y[i] = gelu(x[i]);
}

static cudaStream_t g_side = nullptr;

extern "C" int gelu_forward_detached(const float* x, float* y, int64_t n, void* caller_stream) {
  if (g_side == nullptr && cudaStreamCreateWithFlags(&g_side, cudaStreamNonBlocking) != cudaSuccess) return -1;
  // Order after whatever the caller queued (the input is ready), but never joined back.
  cudaEvent_t ready;
  cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
  cudaEventRecord(ready, static_cast<cudaStream_t>(caller_stream));
  cudaStreamWaitEvent(g_side, ready, 0);
  cudaEventDestroy(ready);
  const int threads = 256;
  const int64_t blocks = (n + threads - 1) / threads;
  for (int pass = 0; pass < 8; ++pass) gelu_kernel<<<static_cast<unsigned>(blocks), threads, 0, g_side>>>(x, y, n);
  return static_cast<int>(cudaGetLastError());
}
