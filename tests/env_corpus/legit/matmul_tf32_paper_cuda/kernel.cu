// The tiled GEMM of legit/matmul_tiled_cuda with its operands rounded to TF32 (10-bit mantissa, as
// tensor cores take fp32 data): relative errors near 1e-3, inside the paper's 1e-2 tolerance, far
// outside the strict 1e-4.
// C = A @ B, A (M, K), B (K, N), float32. Each 256-thread block computes a 64x64 tile of C,
// each thread a 4x4 register block, with 16-wide K slices of A and B staged in shared memory.
#include <cstdint>
#include <cuda_runtime.h>

__device__ __forceinline__ float tf32(float v) {  // round to nearest on the 13 dropped bits
  return __uint_as_float((__float_as_uint(v) + 0x1000u) & 0xffffe000u);
}


constexpr int BM = 64, BN = 64, BK = 16, TM = 4, TN = 4;

__global__ void matmul_tiled(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                             int64_t M, int64_t K, int64_t N) {
  __shared__ float As[BK][BM + 4];  // transposed: As[k][m]
  __shared__ float Bs[BK][BN + 4];
  int tid = threadIdx.x;
  int tr = tid / (BN / TN), tc = tid % (BN / TN);  // 16 x 16 threads
  int64_t m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  float acc[TM][TN] = {};
  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    for (int i = tid; i < BM * BK; i += blockDim.x) {  // A tile: 64 rows x 16 cols
      int r = i / BK, c = i % BK;
      int64_t gm = m0 + r, gk = k0 + c;
      As[c][r] = (gm < M && gk < K) ? tf32(A[gm * K + gk]) : 0.f;
    }
    for (int i = tid; i < BK * BN; i += blockDim.x) {  // B tile: 16 rows x 64 cols
      int r = i / BN, c = i % BN;
      int64_t gk = k0 + r, gn = n0 + c;
      Bs[r][c] = (gk < K && gn < N) ? tf32(B[gk * N + gn]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      float a[TM], b[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = As[k][tr * TM + i];
#pragma unroll
      for (int j = 0; j < TN; ++j) b[j] = Bs[k][tc * TN + j];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      int64_t gm = m0 + tr * TM + i, gn = n0 + tc * TN + j;
      if (gm < M && gn < N) C[gm * N + gn] = acc[i][j];
    }
}

extern "C" int matmul_forward(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N, void* stream) {
  dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
  matmul_tiled<<<grid, (BM / TM) * (BN / TN), 0, static_cast<cudaStream_t>(stream)>>>(A, B, C, M, K, N);
  return static_cast<int>(cudaGetLastError());
}
