// Swish (x * sigmoid(x)), elementwise: OpenMP threads over the flat array.
#include <cmath>
#include <cstdint>

extern "C" void swish_launcher(float* out, const float* x, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        out[i] = v / (1.0f + std::exp(-v));
    }
}
