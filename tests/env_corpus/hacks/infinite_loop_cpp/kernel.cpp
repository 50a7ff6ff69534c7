// Bug/hack: the kernel spins forever inside C code (ctypes released the GIL; no Python signal
// handler can interrupt it, the process must be killed).
#include <cstdint>

extern "C" void gelu_forward(const float* x, float* y, int64_t n) {
    volatile int64_t spin = 0;
    for (;;) spin = spin + 1;
    (void)x; (void)y; (void)n;
}
