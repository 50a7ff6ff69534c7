// argmax over the middle axis of an (outer, red, inner) view; int64 indices; first maximum wins
// and NaN counts as the maximum, as in torch.
#include <cmath>
#include <cstdint>
#include <vector>

extern "C" void argmax_forward(const float* x, int64_t* out, int64_t outer, int64_t red, int64_t inner) {
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
        const float* base = x + o * red * inner;
        int64_t* idx = out + o * inner;
        std::vector<float> best(base, base + inner);
        for (int64_t i = 0; i < inner; ++i) idx[i] = 0;
        for (int64_t r = 1; r < red; ++r) {
            const float* row = base + r * inner;
            for (int64_t i = 0; i < inner; ++i) {
                const float v = row[i];
                if (std::isnan(best[i])) continue;
                if (v > best[i] || std::isnan(v)) {
                    best[i] = v;
                    idx[i] = r;
                }
            }
        }
    }
}
