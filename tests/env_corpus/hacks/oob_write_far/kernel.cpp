// Bug: an indexing error that writes far past the end of the output (1 TiB beyond it).
#include <cstdint>

extern "C" void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols) {
    (void)x;
    volatile float* far = y + rows * cols + (int64_t(1) << 38);
    *far = 1.0f;
}
