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
from typing import Callable

import torch
import torch.nn.functional as F

def spin(cpu: int) -> None:
    """Spin on ``cpu`` at the lowest priority: it runs only while nothing else wants that CPU."""
    os.sched_setaffinity(0, {cpu})
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError as e:
        print("no SCHED_IDLE", e, flush=True)
    while True:
        pass


def launch_times(call: Callable[[], object], wait: Callable[[], None], calls: int = 60, skipped: int = 5) -> dict:
    """Medians of ``call``'s host time (its return) and total (device synced), and the host time's
    90th percentile, in ms, over ``calls`` calls each after ``wait()``, the first ``skipped`` left out."""
    host, total = [], []
    for k in range(calls):
        wait()
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        result = call()
        returned = time.perf_counter_ns()
        torch.cuda.synchronize()
        synced = time.perf_counter_ns()
        del result
        if k >= skipped:
            host.append((returned - start) / 1e6)
            total.append((synced - start) / 1e6)
    return {"host_ms": round(statistics.median(host), 4), "total_ms": round(statistics.median(total), 4),
            "host_p90": round(sorted(host)[int(0.9 * len(host))], 4)}


def idle(gap: float, busy: bool) -> Callable[[], None]:
    """A wait of ``gap`` s, asleep or busy in this process."""
    def busy_wait() -> None:
        end = time.perf_counter() + gap
        while time.perf_counter() < end:
            pass
    return busy_wait if busy else (lambda: time.sleep(gap))


def measure(x: torch.Tensor, gap: float, busy: bool = False) -> dict:
    return launch_times(lambda: F.gelu(x), idle(gap, busy))


def main() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    here, other = cpus[2], cpus[5]  # where the launches run (and the same-CPU spinner), and the other spinner's
    os.sched_setaffinity(0, {here})
    x = torch.randn(2 ** 29, device="cuda")
    launch_times(lambda: F.gelu(x), idle(0.0, False), calls=20)  # warm-up
    rows = {}
    for name, gap, busy, spinner_cpu in (("back to back", 0.0, False, None), ("sleep 20ms", 0.02, False, None),
                                          ("busy 20ms", 0.02, True, None), ("sleep 20ms + idle spinner same cpu", 0.02, False, here),
                                          ("sleep 20ms + idle spinner other cpu", 0.02, False, other), ("sleep 20ms again", 0.02, False, None),
                                          ("sleep 5ms", 0.005, False, None), ("sleep 5ms + idle spinner same cpu", 0.005, False, here)):
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
