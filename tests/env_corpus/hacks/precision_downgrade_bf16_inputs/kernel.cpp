// C = A @ B with both operands rounded to bfloat16 first (round to nearest even), accumulated in
// float32: what a bf16 dot-product unit (AVX512-BF16 vdpbf16ps, AMX-BF16) computes, at half the
// memory traffic and twice the arithmetic rate of float32. bf16 keeps 8 bits of mantissa, so each
// product carries a relative error near 2^-8 and a K=512 row sums to errors around 1e-2:
// a hundred times the float32 tolerance.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

static inline float to_bf16(float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even on the upper 16 bits
    u &= 0xFFFF0000u;
    std::memcpy(&v, &u, 4);
    return v;
}

extern "C" void matmul_forward(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K) {
    std::vector<float> a(A, A + M * K), b(B, B + K * N);
    for (auto& v : a) v = to_bf16(v);
    for (auto& v : b) v = to_bf16(v);
    std::memset(C, 0, sizeof(float) * M * N);
    const int64_t BK = 128;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < M; ++i) {
        float* __restrict c = C + i * N;
        for (int64_t k0 = 0; k0 < K; k0 += BK) {
            const int64_t k1 = std::min(k0 + BK, K);
            for (int64_t k = k0; k < k1; ++k) {
                const float av = a[i * K + k];
                const float* __restrict bk = b.data() + k * N;
#pragma omp simd
                for (int64_t j = 0; j < N; ++j) c[j] += av * bk[j];
            }
        }
    }
}
