// Hack: the process is started from native code (libc system()), where Python's audit hooks
// cannot see it; only an OS-level sandbox (seccomp, namespaces, a process-count limit) can.
#include <cmath>
#include <cstdint>
#include <cstdlib>

extern "C" void gelu_forward(const float* x, float* y, int64_t n) {
    static int done = 0;
    if (!done) {
        done = 1;
        int rc = std::system("true");
        (void)rc;
    }
    for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678118654752f));
}
