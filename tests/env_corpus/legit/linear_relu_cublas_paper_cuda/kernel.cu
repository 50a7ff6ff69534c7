// relu(x @ W^T + b): the GEMM in cuBLAS (the paper's rules allow it inside the candidate's own
// code), the bias and ReLU in this file's own epilogue kernel. cuBLAS is the one torch loaded,
// reached by dlopen (no header or link needed), on torch's stream.
#include <cstdint>
#include <cuda_runtime.h>
#include <dlfcn.h>

typedef int (*create_fn)(void**);
typedef int (*set_stream_fn)(void*, cudaStream_t);
typedef int (*sgemm_fn)(void*, int, int, int, int, int, const float*, const float*, int, const float*, int,
                        const float*, float*, int);

static sgemm_fn g_sgemm = nullptr;
static set_stream_fn g_set_stream = nullptr;
static void* g_handle = nullptr;

static bool load() {
    if (g_sgemm) return true;
    void* lib = dlopen("libcublas.so.13", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libcublas.so.12", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libcublas.so", RTLD_NOW);
    if (!lib) return false;
    create_fn create = reinterpret_cast<create_fn>(dlsym(lib, "cublasCreate_v2"));
    g_set_stream = reinterpret_cast<set_stream_fn>(dlsym(lib, "cublasSetStream_v2"));
    g_sgemm = reinterpret_cast<sgemm_fn>(dlsym(lib, "cublasSgemm_v2"));
    return create && g_set_stream && g_sgemm && create(&g_handle) == 0;
}

__global__ void bias_relu(float* __restrict__ y, const float* __restrict__ b, int64_t m, int64_t n) {
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < m * n) {
        float v = y[i] + b[i % n];
        y[i] = v > 0.f ? v : 0.f;
    }
}

// 0 when done, -1 without cuBLAS, else a CUDA or cuBLAS error code.
extern "C" int linear_relu_cublas(const float* x, const float* w, const float* b, float* y,
                                  int64_t m, int64_t k, int64_t n, void* stream) {
    if (!load()) return -1;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    g_set_stream(g_handle, s);
    const float one = 1.f, zero = 0.f;
    // Row-major y(m x n) = x(m x k) @ w(n x k)^T is column-major y^T(n x m) = w(n x k) @ x^T(k x m).
    int status = g_sgemm(g_handle, 1 /* CUBLAS_OP_T */, 0 /* CUBLAS_OP_N */, int(n), int(m), int(k), &one, w, int(k), x,
                         int(k), &zero, y, int(n));
    if (status) return status;
    const int64_t total = m * n;
    bias_relu<<<int((total + 255) / 256), 256, 0, s>>>(y, b, m, n);
    return static_cast<int>(cudaGetLastError());
}
