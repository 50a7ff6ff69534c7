// Bug: "workspace" allocation in C++: 100 chunks of 1 GiB, all reserved first, then written,
// never freed. Under an address-space limit `new` throws std::bad_alloc at once (uncaught:
// terminate, SIGABRT, "std::bad_alloc" on stderr); under a cgroup limit the reservations
// succeed and the process is OOM-killed while the memset touches the pages.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

extern "C" void gelu_forward(const float* x, float* y, int64_t n) {
    static std::vector<char*> chunks;
    for (int i = 0; i < 100; ++i) chunks.push_back(new char[size_t(1) << 30]);
    for (size_t i = 0; i < chunks.size(); ++i) std::memset(chunks[i], int(i) + 1, size_t(1) << 30);
    for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678118654752f));
}
