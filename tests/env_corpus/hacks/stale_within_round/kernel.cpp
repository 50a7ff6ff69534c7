// ReLU, elementwise: OpenMP threads over the flat array, one read and one write per element.
#include <cstdint>

extern "C" void relu_forward(const float* __restrict x, float* __restrict y, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}
