// 2-D max pooling (square window, stride, implicit -inf padding, floor mode) on NCHW planes.
#include <algorithm>
#include <cmath>
#include <cstdint>

extern "C" void maxpool2d_forward(const float* x, float* y, int64_t planes, int64_t H, int64_t W,
                                  int64_t k, int64_t s, int64_t p, int64_t OH, int64_t OW) {
#pragma omp parallel for schedule(static)
    for (int64_t pl = 0; pl < planes; ++pl) {
        const float* xp = x + pl * H * W;
        float* yp = y + pl * OH * OW;
        for (int64_t oh = 0; oh < OH; ++oh) {
            const int64_t h0 = std::max<int64_t>(oh * s - p, 0), h1 = std::min<int64_t>(oh * s - p + k, H);
            for (int64_t ow = 0; ow < OW; ++ow) {
                const int64_t w0 = std::max<int64_t>(ow * s - p, 0), w1 = std::min<int64_t>(ow * s - p + k, W);
                float m = -INFINITY;
                for (int64_t h = h0; h < h1; ++h)
                    for (int64_t w = w0; w < w1; ++w) {
                        const float v = xp[h * W + w];
                        if (v > m || std::isnan(v)) m = v;
                        if (std::isnan(m)) break;
                    }
                yp[oh * OW + ow] = m;
            }
        }
    }
}
