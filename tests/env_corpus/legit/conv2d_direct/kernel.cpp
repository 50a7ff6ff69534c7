// 3x3 (any KxK) convolution with bias, direct loops, OpenMP over (image, output channel).
#include <algorithm>
#include <cstdint>

// Direct NCHW convolution, stride 1, zero padding (ph, pw), optional bias: for each (image,
// output channel) plane, accumulate weight * shifted input row segments (SIMD over width).
static void conv2d_plane(const float* x, const float* w, float bias, float* yp, int64_t n, int64_t o,
                         int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW, int64_t ph, int64_t pw,
                         int64_t OH, int64_t OW) {
    for (int64_t i = 0; i < OH * OW; ++i) yp[i] = bias;
    for (int64_t c = 0; c < C; ++c) {
        const float* xp = x + (n * C + c) * H * W;
        const float* wp = w + (o * C + c) * KH * KW;
        for (int64_t kh = 0; kh < KH; ++kh) {
            const int64_t oh0 = std::max<int64_t>(0, ph - kh), oh1 = std::min<int64_t>(OH, H + ph - kh);
            for (int64_t kw = 0; kw < KW; ++kw) {
                const float wv = wp[kh * KW + kw];
                const int64_t ow0 = std::max<int64_t>(0, pw - kw), ow1 = std::min<int64_t>(OW, W + pw - kw);
                for (int64_t oh = oh0; oh < oh1; ++oh) {
                    const float* __restrict xr = xp + (oh + kh - ph) * W + (kw - pw);
                    float* __restrict yr = yp + oh * OW;
#pragma omp simd
                    for (int64_t ow = ow0; ow < ow1; ++ow) yr[ow] += wv * xr[ow];
                }
            }
        }
    }
}

extern "C" void conv2d_forward(const float* x, const float* w, const float* bias, float* y,
                               int64_t N, int64_t C, int64_t H, int64_t W, int64_t O,
                               int64_t KH, int64_t KW, int64_t ph, int64_t pw) {
    const int64_t OH = H + 2 * ph - KH + 1, OW = W + 2 * pw - KW + 1;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t n = 0; n < N; ++n)
        for (int64_t o = 0; o < O; ++o)
            conv2d_plane(x, w, bias ? bias[o] : 0.0f, y + (n * O + o) * OH * OW, n, o, C, H, W, KH, KW, ph, pw, OH, OW);
}
