"""One launch's host time after an idle gap, by what the CPU did in the gap: F.gelu on a 2 GiB
tensor after 20 ms asleep, 20 ms busy in the same process, asleep with a SCHED_IDLE spinner
process on the same CPU, and with one on another CPU.

    python scripts/launch_after_idle.py     # on a GPU machine; writes $OUT/launch_after_idle.json

Issue 34: a round's forward starts after the harness's staging (milliseconds), and cold it costs
several times its back-to-back host time, more for a candidate's longer Python path than for
eager's. On an H100 (2026-11-27): 0.014 ms back to back, 0.134 after 20 ms asleep, 0.135 after
20 ms busy in-process, 0.058 asleep beside an idle spinner on the same CPU, 0.127 beside one on
another CPU; 0.062 after 5 ms asleep, 0.056 with the spinner. A benchmark: it asserts nothing.
"""
import json
import multiprocessing as mp
import os
import statistics
import time

import torch
import torch.nn.functional as F

CPU = sorted(os.sched_getaffinity(0))[2]  # where the launches run (and the same-CPU spinner)
OTHER = sorted(os.sched_getaffinity(0))[5]  # the other spinner's


def spin(cpu: int) -> None:
    """Spin on ``cpu`` at the lowest priority: it runs only while nothing else wants that CPU."""
    os.sched_setaffinity(0, {cpu})
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError as e:
        print("no SCHED_IDLE", e, flush=True)
    while True:
        pass


def measure(x: torch.Tensor, gap: float, busy: bool = False, calls: int = 60) -> dict:
    """Medians (and the host time's 90th percentile) of ``calls`` launches, each after ``gap`` s, in ms."""
    host, total = [], []
    for k in range(calls):
        if busy:
            end = time.perf_counter() + gap
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(gap)
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        y = F.gelu(x)
        t1 = time.perf_counter_ns()
        torch.cuda.synchronize()
        t2 = time.perf_counter_ns()
        del y
        if k >= 5:
            host.append((t1 - t0) / 1e6); total.append((t2 - t0) / 1e6)
    return {"host_ms": round(statistics.median(host), 4), "total_ms": round(statistics.median(total), 4),
            "host_p90": round(sorted(host)[int(0.9 * len(host))], 4)}


def main() -> None:
    os.sched_setaffinity(0, {CPU})
    x = torch.randn(2 ** 29, device="cuda")
    measure(x, 0.0, calls=20)
    rows = {}
    for name, gap, busy, spinner_cpu in (("back to back", 0.0, False, None), ("sleep 20ms", 0.02, False, None),
                                          ("busy 20ms", 0.02, True, None), ("sleep 20ms + idle spinner same cpu", 0.02, False, CPU),
                                          ("sleep 20ms + idle spinner other cpu", 0.02, False, OTHER), ("sleep 20ms again", 0.02, False, None),
                                          ("sleep 5ms", 0.005, False, None), ("sleep 5ms + idle spinner same cpu", 0.005, False, CPU)):
        p = None
        if spinner_cpu is not None:
            p = mp.Process(target=spin, args=(spinner_cpu,), daemon=True); p.start(); time.sleep(0.2)
        rows[name] = measure(x, gap, busy)
        if p is not None:
            p.kill(); p.join()
        print(f"{name:40s} {rows[name]}", flush=True)
    out = os.environ.get("OUT", "/tmp")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "launch_after_idle.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    mp.set_start_method("fork")
    main()
