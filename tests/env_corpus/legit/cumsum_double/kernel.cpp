// Inclusive prefix sum along the last dimension, running total kept in double.
#include <cstdint>

extern "C" void cumsum_forward(const float* x, float* y, int64_t rows, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * n;
        float* yr = y + r * n;
        double acc = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            acc += xr[i];
            yr[i] = static_cast<float>(acc);
        }
    }
}
