// Does not compile: undeclared identifier and a missing semicolon.
#include <cstdint>

extern "C" void gelu_forward(const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = gelu_approx(x[i])
}
