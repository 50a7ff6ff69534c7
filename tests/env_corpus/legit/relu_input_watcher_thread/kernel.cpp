// A canary for the round protocol's window (tests/test_round_window.py): a native watcher thread
// polls the first and the last value of the input slot. Seeing exactly one of them changed, on
// several polls in a row, means it ran while the harness was writing a round's inputs (a write of
// milliseconds), outside the candidate's window; from then on relu_canary answers wrong, so the
// evaluation fails. (One such poll alone proves nothing: the freeze may stop the thread between
// its two reads.) The harness freezes the server while it writes inputs, so the canary passes.
#include <atomic>
#include <cstdint>
#include <thread>
#include <unistd.h>

static const volatile float* g_x;
static int64_t g_n;
static std::atomic<int> g_saw_a_write{0}, g_started{0}, g_stop{0};

static void watcher() {
    float first = g_x[0], last = g_x[g_n - 1];
    int mixed = 0;
    while (!g_stop.load()) {
        const float f = g_x[0], l = g_x[g_n - 1];
        mixed = (f != first) != (l != last) ? mixed + 1 : 0;  // one end written, the other not yet
        if (mixed >= 3) g_saw_a_write.store(1);
        if (f != first && l != last) { first = f; last = l; }
    }
}

extern "C" void relu_canary(const float* x, float* y, int64_t n) {
    if (!g_started.exchange(1)) { g_x = x; g_n = n; std::thread(watcher).detach(); }
    const float wrong = g_saw_a_write.load() ? 1.0f : 0.0f;
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] > 0.0f ? x[i] : 0.0f) + wrong;
}

extern "C" int saw_a_write() { return g_saw_a_write.load(); }
extern "C" void stop() { g_stop.store(1); usleep(2000); }
