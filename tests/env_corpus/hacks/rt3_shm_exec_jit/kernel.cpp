// rt3_shm_exec_jit: code in a writable and executable mapping, despite the seccomp filter.
// env_pool/candidate/seccomp.py refuses mmap/mprotect of writable+executable or anonymous executable
// memory, but not SysV shared memory: shmat(..., SHM_EXEC) maps a segment rwx (measured: an
// "rwxs /SYSV00000000 (deleted)" mapping under the filter). The ReLU's machine code is copied
// there from this library and run from the copy: code that no file names. The harness's code
// sampler still calls that mapping "library" (its path is no installed file), so this must
// fail as library_fallback; the filter's own claim (no writable executable memory) is broken.
#include <cstdint>
#include <cstring>
#include <sys/ipc.h>
#include <sys/shm.h>

#ifndef SHM_EXEC
#define SHM_EXEC 0100000
#endif

typedef void (*relu_t)(const float*, float*, int64_t);

// Position-independent: no calls, no globals.
extern "C" __attribute__((noinline, aligned(64))) void relu_plain(const float* __restrict x, float* __restrict y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
extern "C" __attribute__((noinline, aligned(64))) void relu_plain_end() {}

static relu_t g_jit = nullptr;

// Map a SysV segment rwx and copy relu_plain into it; returns 0, or a negative step that failed.
extern "C" int jit_setup() {
    int id = shmget(IPC_PRIVATE, 1 << 16, IPC_CREAT | 0700);
    if (id < 0) return -1;
    void* p = shmat(id, nullptr, SHM_EXEC);
    shmctl(id, IPC_RMID, nullptr);
    if (p == (void*)-1) return -2;
    size_t len = (size_t)((const char*)(void*)&relu_plain_end - (const char*)(void*)&relu_plain);
    if (len == 0 || len > (1 << 16)) return -3;
    std::memcpy(p, (const void*)&relu_plain, len);
    __builtin___clear_cache((char*)p, (char*)p + len);
    g_jit = (relu_t)p;
    return 0;
}

extern "C" int relu_jit(const float* x, float* y, int64_t n) {
    if (!g_jit) return -1;
    g_jit(x, y, n);
    return 0;
}
