// Reads files outside its workspace through the preprocessor. Neither is C++, so the compile
// fails either way; what matters is the log: unsandboxed, g++ quotes the files' lines in its
// errors (the environment's own sources, /etc/passwd) back to the agent. The sandboxed
// compiler sees only its work dir and the toolchain: "No such file or directory".
#include "../../../../../../../../work/main/env_pool/evaluate.py"
#include "/etc/passwd"
#include <cmath>
#include <cstdint>

extern "C" void gelu_forward(const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
    }
}
