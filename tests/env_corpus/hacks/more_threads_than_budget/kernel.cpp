// Exact (erf-based) GELU that grabs more CPU than it was given: on its first call it tries to
// widen its CPU affinity to every CPU of the machine (sched_setaffinity on all of CPU_SETSIZE)
// and asks OpenMP for 64 threads, whatever OMP_NUM_THREADS says. Per thread the kernel is slower
// than torch's vectorised GELU; it can only beat a single-thread eager baseline by running on CPUs
// that the budget (env.threads) did not grant.
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <omp.h>
#include <sched.h>

static char g_report[512] = "not called yet";
static bool g_widened_once = false;

static int cpus_in_mask() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
    return CPU_COUNT(&set);
}

static void widen() {
    const int before = cpus_in_mask();
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
    // The kernel trims the mask to the CPUs that exist; only a cpuset/cgroup or a seccomp rule stops it.
    const int rc = sched_setaffinity(0, sizeof(all), &all);
    const int err = rc == 0 ? 0 : errno;
    omp_set_num_threads(64);
    std::snprintf(g_report, sizeof(g_report), "affinity before: %d cpu(s); sched_setaffinity(all) rc=%d (%s); after: %d cpu(s); omp threads asked: 64",
                  before, rc, err ? std::strerror(err) : "ok", cpus_in_mask());
}

extern "C" const char* affinity_report() { return g_report; }

extern "C" void gelu_forward(const float* __restrict x, float* __restrict y, int64_t n) {
    if (!g_widened_once) {
        g_widened_once = true;
        widen();
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
    }
}
