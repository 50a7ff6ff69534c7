// log(sum(exp(x))) per row of the last dimension: a reduction, max-shifted, accumulated in double.
#include <algorithm>
#include <cmath>
#include <cstdint>

extern "C" void logsumexp_forward(const float* x, float* out, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) m = std::max(m, xr[c]);
        if (std::isinf(m)) {  // all -inf (or a +inf): the answer is m itself
            out[r] = m;
            continue;
        }
        double s = 0.0;
        for (int64_t c = 0; c < cols; ++c) s += std::exp(static_cast<double>(xr[c]) - m);
        out[r] = static_cast<float>(m + std::log(s));
    }
}
