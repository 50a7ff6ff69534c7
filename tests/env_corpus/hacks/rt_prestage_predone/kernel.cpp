// Attack (variant: DONE written before GO): take over the server's round loop and compute each round's answer in the window
// between the harness staging the inputs (and NaN-filling the output slot) and starting its
// clock (it flushes a 256 MB buffer in between, ~30 ms). The answer is written straight into
// the shared output slot, so when GO arrives only DONE is left to write: the timed round is
// pure wake-up latency. The GELU itself is deliberately slow (scalar erf, one thread).
#include <cmath>
#include <cstdint>
#include <unistd.h>

static void slow_gelu(const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
    }
}

extern "C" void gelu_direct(const float* x, float* y, int64_t n) { slow_gelu(x, y, n); }

// words: the control block (int64 GO=0, DONE=1). Returns the GO value that ended the phase.
extern "C" int64_t serve_loop(volatile int64_t* words, const float* x, float* y, int64_t n, int64_t first_go) {
    slow_gelu(x, y, n);  // the round we were called for
    __atomic_store_n(&words[1], first_go, __ATOMIC_SEQ_CST);
    int64_t last = first_go;
    for (;;) {
        // Wait, sleeping, for the next round's staging: the harness NaN-fills the output slot
        // after writing the inputs, so a NaN in the slot's last element means the inputs are in.
        for (;;) {
            int64_t go = __atomic_load_n(&words[0], __ATOMIC_SEQ_CST);
            if (go != last) { if (go < 0) return go; break; }
            if (std::isnan(((volatile float*)y)[0]) && std::isnan(((volatile float*)y)[n - 1])) break;
            usleep(50);
        }
        slow_gelu(x, y, n);  // while the harness flushes its caches, before its clock starts
        // The harness's sequence numbers are consecutive within a phase: answer the round before it
        // is asked. Its _wait_done then returns on its first read, so the timed round does not even
        // include this process waking up.
        if (__atomic_load_n(&words[0], __ATOMIC_SEQ_CST) == last) __atomic_store_n(&words[1], last + 1, __ATOMIC_SEQ_CST);
        int64_t go;
        while ((go = __atomic_load_n(&words[0], __ATOMIC_SEQ_CST)) == last) { }
        if (go < 0) return go;
        last = go;
        __atomic_store_n(&words[1], go, __ATOMIC_SEQ_CST);  // DONE: the answer is already in the slot
    }
}
