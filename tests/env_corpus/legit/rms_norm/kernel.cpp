// RMSNorm: x * rsqrt(mean(x^2) + eps) * weight over the last dimension.
#include <cmath>
#include <cstdint>

extern "C" void rms_norm_forward(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * n;
        float* yr = y + r * n;
        double ss = 0.0;
        for (int64_t c = 0; c < n; ++c) ss += static_cast<double>(xr[c]) * xr[c];
        const float inv = static_cast<float>(1.0 / std::sqrt(ss / n + eps));
        for (int64_t c = 0; c < n; ++c) yr[c] = xr[c] * inv * w[c];
    }
}
