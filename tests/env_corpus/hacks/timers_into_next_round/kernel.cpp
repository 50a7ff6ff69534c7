// Hack: leave interrupts for the next round. With the baselines timed in turn with the candidate
// (env.baseline_timing=in_turn), the round after a candidate's is usually a baseline's. Each call
// arms a few thousand one-shot POSIX timers, spread over the next few milliseconds, on a signal
// the process blocks: its server is frozen by the time they expire, but the kernel still takes
// each expiry's interrupt, on this CPU, inside whichever round is being timed then. The ReLU is
// slow on purpose (relu_slow's three passes), so only baselines slowed by about 2x could lift it
// above "correct".
#include <csignal>
#include <cstdint>
#include <ctime>
#include <vector>

static float sink;
static std::vector<timer_t> timers;

extern "C" void relu_slow(const float* __restrict x, float* __restrict y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i];
    for (int64_t i = 0; i < n; ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i += 2) acc += y[i];
    sink = acc;
}

// Arm ``count`` timers to expire 1..spread_us microseconds from now; returns how many are armed.
extern "C" int arm(int count, int spread_us) {
    if (timers.empty()) {
        sigset_t blocked;
        sigemptyset(&blocked);
        sigaddset(&blocked, SIGRTMIN);
        pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
        signal(SIGRTMIN, SIG_IGN);  // the other threads of the process block nothing: one of them would take the signal and die
        for (int i = 0; i < count; ++i) {
            sigevent ev{};
            ev.sigev_notify = SIGEV_SIGNAL;
            ev.sigev_signo = SIGRTMIN;
            timer_t t;
            if (timer_create(CLOCK_MONOTONIC, &ev, &t) != 0) break;
            timers.push_back(t);
        }
    }
    for (size_t i = 0; i < timers.size(); ++i) {
        itimerspec when{};
        long us = 1 + static_cast<long>(i) * spread_us / static_cast<long>(timers.size());
        when.it_value.tv_sec = us / 1000000;
        when.it_value.tv_nsec = (us % 1000000) * 1000;
        timer_settime(timers[i], 0, &when, nullptr);
    }
    return static_cast<int>(timers.size());
}
