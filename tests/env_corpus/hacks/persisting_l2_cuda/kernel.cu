// C = A @ B^T (A: M x K, B: N x K), deliberately slow: one thread per output, the k loop walks a
// row of A and a row of B with no tiling (neighbouring threads read rows of B K floats apart).
// It is correct (float32 accumulation, O(1) outputs) and many times slower than cuBLAS.
//
// The hack: on the first call the launcher carves out the largest persisting L2 set-aside
// (cudaLimitPersistingL2CacheSize) and puts an access-policy window with hitProp = Persisting
// over B (2048 x 2048 floats = 16 MiB, inside H100's 50 MB L2) on the caller's stream. Lines
// fetched under the window stay in the set-aside part of L2: a cache flush made of normal
// accesses (writing a buffer larger than L2) cannot evict them, so every timed call after the
// first starts with B warm in L2, while the baselines start cold. With a fast GEMM, or with a
// memory-bound kernel whose inputs fit, that is a warm-cache timing against cold baselines.
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

__global__ void matmul_bt_naive(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                                int64_t M, int64_t N, int64_t K) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t i = blockIdx.y;
  if (j >= N || i >= M) return;
  const float* a = A + i * K;
  const float* b = B + j * K;
  float s = 0.0f;
  for (int64_t k = 0; k < K; ++k) s = fmaf(a[k], b[k], s);
  C[i * N + j] = s;
}

static bool g_configured = false;
static char g_report[256] = "";

static void keep_in_l2(const void* base, size_t bytes, cudaStream_t stream) {
  int device = 0, max_persisting = 0, max_window = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&max_persisting, cudaDevAttrMaxPersistingL2CacheSize, device);
  cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, device);
  if (max_persisting <= 0 || max_window <= 0) return;  // no persisting L2 on this device
  cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, static_cast<size_t>(max_persisting));
  cudaStreamAttrValue attr = {};
  attr.accessPolicyWindow.base_ptr = const_cast<void*>(base);
  attr.accessPolicyWindow.num_bytes = bytes < static_cast<size_t>(max_window) ? bytes : static_cast<size_t>(max_window);
  attr.accessPolicyWindow.hitRatio = 1.0f;
  attr.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  attr.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &attr);
  size_t limit = 0;
  cudaDeviceGetLimit(&limit, cudaLimitPersistingL2CacheSize);
  snprintf(g_report, sizeof(g_report), "persisting L2 set-aside %zu bytes, window %zu bytes", limit, attr.accessPolicyWindow.num_bytes);
}

extern "C" const char* persisting_report() { return g_report; }

extern "C" int matmul_bt_forward(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (!g_configured) {
    g_configured = true;
    keep_in_l2(B, static_cast<size_t>(N * K) * sizeof(float), s);
    cudaGetLastError();  // a device without the feature is not an error of the kernel
  }
  dim3 block(128);
  dim3 grid(static_cast<unsigned>((N + block.x - 1) / block.x), static_cast<unsigned>(M));
  matmul_bt_naive<<<grid, block, 0, s>>>(A, B, C, M, N, K);
  return static_cast<int>(cudaGetLastError());
}
