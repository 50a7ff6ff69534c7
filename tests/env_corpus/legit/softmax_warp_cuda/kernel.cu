// Row softmax: one 256-thread block per row. Each thread folds its strided elements into a
// running max and sum (online softmax), warps combine with __shfl_xor_sync, and the 8 warp
// results meet in shared memory. A second pass writes exp(x - max) / sum.
#include <cstdint>
#include <cuda_runtime.h>
#include <math.h>

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ void combine(float& m, float& s, float om, float os) {
  float nm = fmaxf(m, om);
  s = (m == -INFINITY ? 0.f : s * expf(m - nm)) + (om == -INFINITY ? 0.f : os * expf(om - nm));
  m = nm;
}

__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
  const float* row = x + blockIdx.x * cols;
  float* out = y + blockIdx.x * cols;
  float m = -INFINITY, s = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) combine(m, s, row[j], 1.f);
  for (int off = 16; off > 0; off >>= 1) {
    float om = __shfl_xor_sync(0xffffffffu, m, off);
    float os = __shfl_xor_sync(0xffffffffu, s, off);
    combine(m, s, om, os);
  }
  __shared__ float sm[kWarps], ss[kWarps];
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) { sm[warp] = m; ss[warp] = s; }
  __syncthreads();
  if (warp == 0) {
    m = lane < kWarps ? sm[lane] : -INFINITY;
    s = lane < kWarps ? ss[lane] : 0.f;
    for (int off = 16; off > 0; off >>= 1) {
      float om = __shfl_xor_sync(0xffffffffu, m, off);
      float os = __shfl_xor_sync(0xffffffffu, s, off);
      combine(m, s, om, os);
    }
    if (lane == 0) { sm[0] = m; ss[0] = s; }
  }
  __syncthreads();
  float mx = sm[0], inv = 1.f / ss[0];
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) out[j] = expf(row[j] - mx) * inv;
}

extern "C" int softmax_forward(const float* x, float* y, int64_t rows, int64_t cols, void* stream) {
  softmax_rows<<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, y, cols);
  return static_cast<int>(cudaGetLastError());
}
