// y = relu(x @ W^T + b): x (M, K), W (N, K), b (N), y (M, N), float32, full-precision FMA.
// 32x32 output tiles; both operands staged through shared memory in 32-wide K slices; the
// bias add and ReLU happen in registers before the single store (no extra pass over y).
#include <cstdint>
#include <cuda_runtime.h>

constexpr int T = 32;

__global__ void linear_bias_relu(const float* __restrict__ x, const float* __restrict__ w,
                                 const float* __restrict__ b, float* __restrict__ y,
                                 int64_t M, int64_t K, int64_t N) {
  __shared__ float xs[T][T + 1];
  __shared__ float ws[T][T + 1];  // ws[n][k]: a row of W, i.e. a column of W^T
  int64_t row = blockIdx.y * T + threadIdx.y;  // of y (and x)
  int64_t col = blockIdx.x * T + threadIdx.x;  // of y (a row of W)
  float acc = 0.f;
  for (int64_t k0 = 0; k0 < K; k0 += T) {
    int64_t kx = k0 + threadIdx.x;
    xs[threadIdx.y][threadIdx.x] = (row < M && kx < K) ? x[row * K + kx] : 0.f;
    int64_t wn = blockIdx.x * T + threadIdx.y;
    ws[threadIdx.y][threadIdx.x] = (wn < N && kx < K) ? w[wn * K + kx] : 0.f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < T; ++k) acc = fmaf(xs[threadIdx.y][k], ws[threadIdx.x][k], acc);
    __syncthreads();
  }
  if (row < M && col < N) y[row * N + col] = fmaxf(acc + b[col], 0.f);
}

extern "C" int linear_bias_relu_forward(const float* x, const float* w, const float* b, float* y,
                                        int64_t M, int64_t K, int64_t N, void* stream) {
  dim3 block(T, T);
  dim3 grid((N + T - 1) / T, (M + T - 1) / T);
  linear_bias_relu<<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(x, w, b, y, M, K, N);
  return static_cast<int>(cudaGetLastError());
}
