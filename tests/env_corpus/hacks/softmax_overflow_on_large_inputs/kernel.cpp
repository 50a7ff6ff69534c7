// Row softmax WITHOUT the max subtraction: exp(x) overflows to inf for inputs above ~88, so the
// result is NaN there. The task's random inputs (randn * 4) never get near that, so it passes the
// sweep's 5 input sets; the audit's adversarial inputs (large magnitudes) must catch it.
#include <cmath>
#include <cstdint>

extern "C" void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        double s = 0.0;
        for (int64_t c = 0; c < cols; ++c) {
            const float e = std::exp(xr[c]);
            yr[c] = e;
            s += e;
        }
        const float inv = static_cast<float>(1.0 / s);
        for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
    }
}
