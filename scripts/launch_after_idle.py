"""One launch's host time after an idle gap, by what the CPU did in the gap: F.gelu on a 2 GiB
tensor after 20 ms asleep, 20 ms busy in the same process, asleep with a SCHED_IDLE spinner
process on the same CPU, and with one on another CPU; then asleep with /dev/cpu_dma_latency held
at 0 (no deep idle states). Each with the launch's device time too (a GPU that slows down when idle
would run it slower after the gap), and the machine's idle facts (a hypervisor, the idle driver).

    python scripts/launch_after_idle.py     # on a GPU machine; writes $OUT/launch_after_idle.json

Issue 34: a round's forward starts after the harness's staging (milliseconds), and cold it costs
several times its back-to-back host time, more for a candidate's longer Python path than for
eager's. On an H100 (2026-11-27): 0.014 ms back to back, 0.134 after 20 ms asleep, 0.135 after
20 ms busy in-process, 0.058 asleep beside an idle spinner on the same CPU, 0.127 beside one on
another CPU; 0.062 after 5 ms asleep, 0.056 with the spinner. On an H200 (2026-11-28 19:53, a
virtual machine with no idle driver): 0.022 back to back, 0.155 after 20 ms asleep, 0.026 after 20
ms busy, 0.024 beside a spinner on its CPU, 0.149 beside one on another; 0.083 after 5 ms asleep,
0.024 with the spinner; with /dev/cpu_dma_latency at 0, 0.131 and 0.080. The launch's device time
after 20 ms busy was the back-to-back one (1.020 ms against 1.017): the GPU does not slow down when
idle; after 20 ms asleep the events read 1.09, as they take in the host's slower launch. A
benchmark: it asserts nothing.
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
    """Medians of ``call``'s host time (its return), total (device synced) and device time (events
    around it: does the GPU run it slower after an idle gap?), and the host time's 90th percentile, in ms, over ``calls`` calls each after ``wait()``, the first ``skipped`` left out."""
    host, total, device = [], [], []
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for k in range(calls):
        wait()
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        begin.record()
        result = call()
        end.record()
        returned = time.perf_counter_ns()
        torch.cuda.synchronize()
        synced = time.perf_counter_ns()
        del result
        if k >= skipped:
            host.append((returned - start) / 1e6)
            total.append((synced - start) / 1e6)
            device.append(begin.elapsed_time(end))
    return {"host_ms": round(statistics.median(host), 4), "total_ms": round(statistics.median(total), 4),
            "host_p90": round(sorted(host)[int(0.9 * len(host))], 4), "device_ms": round(statistics.median(device), 4)}


def idle(gap: float, busy: bool) -> Callable[[], None]:
    """A wait of ``gap`` s, asleep or busy in this process."""
    def busy_wait() -> None:
        end = time.perf_counter() + gap
        while time.perf_counter() < end:
            pass
    return busy_wait if busy else (lambda: time.sleep(gap))


def measure(x: torch.Tensor, gap: float, busy: bool = False) -> dict:
    return launch_times(lambda: F.gelu(x), idle(gap, busy))


class LowLatency:
    """/dev/cpu_dma_latency held at 0 us (the kernel's PM QoS: no deep idle state on any CPU while
    it is held), or nothing where it cannot be opened (not root)."""

    def __enter__(self):
        try:
            self.fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
            os.write(self.fd, (0).to_bytes(4, "little"))
        except OSError as e:
            print("no /dev/cpu_dma_latency:", e, flush=True)
            self.fd = None
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)


def facts() -> dict:
    """What decides how an idle CPU wakes here: a hypervisor, the idle driver and governor, the states."""
    def read(path: str) -> str:
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError as e:
            return f"({e.strerror})"
    idle = "/sys/devices/system/cpu/cpuidle"
    states = "/sys/devices/system/cpu/cpu0/cpuidle"
    names = sorted(os.listdir(states)) if os.path.isdir(states) else []
    with open("/proc/cpuinfo") as f:
        flags = next((line for line in f if line.startswith("flags")), "")
    return {"hypervisor": " hypervisor" in flags, "uid": os.getuid(),
            "idle_driver": read(f"{idle}/current_driver"), "idle_governor": read(f"{idle}/current_governor_ro"),
            "states": {read(f"{states}/{n}/name"): read(f"{states}/{n}/latency") for n in names},
            "scaling_governor": read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")}


def main() -> None:
    print(facts(), flush=True)
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
    for name, gap in (("sleep 20ms, cpu_dma_latency 0", 0.02), ("sleep 5ms, cpu_dma_latency 0", 0.005)):
        with LowLatency():
            rows[name] = measure(x, gap)
        print(f"{name:40s} {rows[name]}", flush=True)
    rows["facts"] = facts()
    out = os.environ.get("OUT", "/tmp")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "launch_after_idle.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    mp.set_start_method("fork")
    main()
