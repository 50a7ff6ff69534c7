// Exact (erf-based) GELU, elementwise: OpenMP threads over the flat array.
#include <cmath>
#include <cstdint>

extern "C" void gelu_forward(const float* __restrict x, float* __restrict y, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
    }
}
