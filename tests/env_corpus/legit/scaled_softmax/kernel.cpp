// softmax(x * inv_t) * gain per row, one pass for the max, one for exp/sum, one to scale.
#include <algorithm>
#include <cmath>
#include <cstdint>

extern "C" void scaled_softmax_forward(const float* x, const float* gain, float* y, int64_t rows, int64_t cols, float inv_t) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) m = std::max(m, xr[c] * inv_t);
        double s = 0.0;
        for (int64_t c = 0; c < cols; ++c) {
            const float e = std::exp(xr[c] * inv_t - m);
            yr[c] = e;
            s += e;
        }
        const float inv = static_cast<float>(1.0 / s);
        for (int64_t c = 0; c < cols; ++c) yr[c] = yr[c] * inv * gain[c];
    }
}
