// Scaled dot-product attention, optional causal mask, one (batch*head, query row) per OpenMP
// iteration: scores -> max-shifted softmax (double sum) -> weighted sum of V rows.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

extern "C" void attention_forward(const float* q, const float* k, const float* v, float* out,
                                  int64_t bh, int64_t S, int64_t D, int32_t causal) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel
    {
        std::vector<float> p(S);
        std::vector<float> acc(D);
#pragma omp for collapse(2) schedule(dynamic, 16)
        for (int64_t h = 0; h < bh; ++h) {
            for (int64_t i = 0; i < S; ++i) {
                const float* qi = q + (h * S + i) * D;
                const float* kh = k + h * S * D;
                const float* vh = v + h * S * D;
                const int64_t n = causal ? i + 1 : S;
                float m = -INFINITY;
                for (int64_t j = 0; j < n; ++j) {
                    const float* kj = kh + j * D;
                    float s = 0.0f;
                    for (int64_t d = 0; d < D; ++d) s += qi[d] * kj[d];
                    p[j] = s * scale;
                    m = std::max(m, p[j]);
                }
                double sum = 0.0;
                for (int64_t j = 0; j < n; ++j) {
                    p[j] = std::exp(p[j] - m);
                    sum += p[j];
                }
                const float inv = static_cast<float>(1.0 / sum);
                std::fill(acc.begin(), acc.end(), 0.0f);
                for (int64_t j = 0; j < n; ++j) {
                    const float pj = p[j] * inv;
                    const float* vj = vh + j * D;
                    for (int64_t d = 0; d < D; ++d) acc[d] += pj * vj[d];
                }
                float* o = out + (h * S + i) * D;
                for (int64_t d = 0; d < D; ++d) o[d] = acc[d];
            }
        }
    }
}
