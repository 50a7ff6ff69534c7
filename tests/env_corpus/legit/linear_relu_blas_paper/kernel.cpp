// relu(x @ W^T + b) with the GEMM in a BLAS library (the paper's rules let a kernel call cuBLAS,
// on the CPU a BLAS) and the bias and ReLU fused in this file's own epilogue. The BLAS is the
// OpenBLAS numpy already loaded in this process, found among the loaded objects, never by path.
#include <cstdint>
#include <cstring>
#include <dlfcn.h>
#include <link.h>

typedef void (*sgemm_fn)(int order, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

static int find_openblas(struct dl_phdr_info* info, size_t, void* out) {
    if (info->dlpi_name && std::strstr(info->dlpi_name, "openblas")) {
        *static_cast<const char**>(out) = info->dlpi_name;
        return 1;
    }
    return 0;
}

static sgemm_fn sgemm() {
    static sgemm_fn fn = nullptr;
    if (!fn) {
        const char* name = nullptr;
        dl_iterate_phdr(find_openblas, &name);
        void* lib = name ? dlopen(name, RTLD_NOW | RTLD_NOLOAD) : nullptr;
        if (lib) fn = reinterpret_cast<sgemm_fn>(dlsym(lib, "scipy_cblas_sgemm64_"));
        if (!fn && lib) fn = reinterpret_cast<sgemm_fn>(dlsym(lib, "cblas_sgemm"));
    }
    return fn;
}

// 0 when done, -1 when no BLAS was found (the caller raises).
extern "C" int linear_relu_forward(const float* x, const float* w, const float* bias, float* y,
                                   int64_t m, int64_t k, int64_t n) {
    sgemm_fn gemm = sgemm();
    if (!gemm) return -1;
    gemm(101 /* row major */, 111 /* no transpose */, 112 /* transpose */, m, n, k, 1.0f, x, k, w, k, 0.0f, y, n);
    for (int64_t i = 0; i < m; ++i) {
        float* row = y + i * n;
        for (int64_t j = 0; j < n; ++j) {
            const float v = row[j] + bias[j];
            row[j] = v > 0.0f ? v : 0.0f;
        }
    }
    return 0;
}
