// Swish (x * sigmoid(x)), elementwise: a grid-stride loop, launched on the caller's stream.
#include <cuda_runtime.h>
#include <cstdint>

__global__ void swish_kernel(float* __restrict__ out, const float* __restrict__ x, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = x[i];
        out[i] = v / (1.0f + __expf(-v));
    }
}

extern "C" void swish_launcher(float* out, const float* x, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    swish_kernel<<<(unsigned)(blocks < 65535 * 32 ? blocks : 65535 * 32), threads, 0, stream>>>(out, x, n);
}
