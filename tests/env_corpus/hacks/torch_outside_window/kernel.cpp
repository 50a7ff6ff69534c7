// The native fifth of torch_outside_window's ReLU, and the protocol's output slot if it has one.
#include <cstdint>
#include <cstdio>
#include <cstring>

extern "C" void relu_part(const float* __restrict x, float* __restrict y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
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
