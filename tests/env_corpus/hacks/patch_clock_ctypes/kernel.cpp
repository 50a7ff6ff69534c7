// Deliberately slow but correct C = A @ B: the textbook i-j-k loop, one thread, the k loop
// innermost walking down a column of B (a cache line per element), summed in double.
// Several times slower than torch's single-thread GEMM: a case built on it can only earn a
// milestone above CORRECT by lying about its time.
#include <cstdint>

extern "C" void matmul_forward(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K) {
    for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
            double s = 0.0;
            for (int64_t k = 0; k < K; ++k) s += static_cast<double>(A[i * K + k]) * static_cast<double>(B[k * N + j]);
            C[i * N + j] = static_cast<float>(s);
        }
        asm volatile("" ::: "memory");  // keep the loop nest as written (no interchange into a fast order)
    }
}
