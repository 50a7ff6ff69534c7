// Bug: writes through a null pointer.
#include <cstdint>

extern "C" void gelu_forward(const float* x, float* y, int64_t n) {
    (void)x; (void)y; (void)n;
    volatile float* p = nullptr;
    *p = 1.0f;
}
