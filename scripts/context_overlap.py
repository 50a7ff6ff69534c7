"""Can one process's GPU work run while another process's kernel holds the device? On a GPU machine.

    python scripts/context_overlap.py     # writes $OUT/context_overlap.json (default /tmp)

Issue 34, a question before a design: a round's host path (the server's wake, its forward's
Python, its launch) runs cold and adds to the round's time, where do_bench's back-to-back loop
hides it behind the previous call's device work. A trusted "gate" would hide it the same way: the
harness launches a spin kernel of G ms on its own stream just before GO, and the round is timed
from the gate's end. That is sound only if nothing of the candidate's (another process, so another
CUDA context) can run on the device during the gate: not a kernel (contexts are time-sliced, and a
slice boundary inside the gate would let one in), not a copy (copy engines may serve another
context's copies beside a kernel). This measures both: a "harness" process launches a spin kernel
of G ms (``torch.cuda._sleep``) and a "candidate" process, a moment later, a tiny kernel, a 64 MiB
device-to-host copy and a 64 MiB device-to-device copy, each timed to its end on the shared
monotonic clock. An operation that ends well before the gate does ran beside it. A benchmark: it
asserts nothing.

On an H200 (2026-11-28 19:53, `gpu_wave.sh start overlap`; ms by which the operation ended before
the gate's end, medians of 7, negative: after it):

| gate | kernel | copy to host (64 MiB) | copy on the device (64 MiB) |
| --- | --- | --- | --- |
| 0.5 ms | -0.14 | -1.19 | -0.17 |
| 2 ms | -0.14 | -0.69 (-0.48 at most) | -0.17 |
| 10 ms | +1.34 | +2.11 | +1.31 |
| 50 ms | +15.7 | +16.5 | +15.7 |

So the gate is not built: the other context's kernels wait out a gate of up to 2 ms (and ~0.14 ms
more, the switch between contexts), but run inside a longer one (time slices), and its copy to the
host ran partly inside a 2 ms gate (about 1.05 ms long after a 0.5 ms gate, it ended only 0.5-0.7
ms after a 2 ms one): a copy engine serves another context beside the gate's kernel, so a
candidate could move its inputs in time the gate would have taken off its clock.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import statistics
import time

GATES_MS = (0.5, 2.0, 10.0, 50.0)  # spans the time slices the driver may use
REPEATS = 7
DELAY_S = 0.0002  # the candidate's operation starts this long after the gate's launch
OPERATIONS = ("kernel", "copy_to_host", "copy_on_device")


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def harness(plan: list[tuple[float, str]], ready: mp.Barrier, results: mp.Queue) -> None:
    import torch

    torch.cuda.init()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    torch.cuda.synchronize()
    cycles_per_ms = 10_000_000 / start.elapsed_time(end)
    for gate, _ in plan:
        ready.wait()
        torch.cuda._sleep(int(gate * cycles_per_ms))
        torch.cuda.synchronize()
        results.put(("gate", gate, time.perf_counter_ns()))


def candidate(plan: list[tuple[float, str]], ready: mp.Barrier, results: mp.Queue) -> None:
    import torch

    torch.cuda.init()
    small = torch.zeros(1024, device="cuda")
    source = torch.ones(16 << 20, device="cuda")  # 64 MiB
    host = torch.empty(16 << 20, pin_memory=True)
    device = torch.empty_like(source)
    work = {"kernel": lambda: small.add_(1), "copy_to_host": lambda: host.copy_(source, non_blocking=True),
            "copy_on_device": lambda: device.copy_(source, non_blocking=True)}
    torch.cuda.synchronize()
    for gate, operation in plan:
        ready.wait()
        _busy(DELAY_S)
        work[operation]()
        torch.cuda.synchronize()
        results.put((operation, gate, time.perf_counter_ns()))


def main() -> None:
    plan = [(gate, operation) for gate in GATES_MS for operation in OPERATIONS for _ in range(REPEATS)]
    ready, results = mp.Barrier(2), mp.Queue()
    procs = [mp.Process(target=f, args=(plan, ready, results)) for f in (harness, candidate)]
    for p in procs:
        p.start()
    rows = []
    while len(rows) < 2 * len(plan):
        try:
            rows.append(results.get(timeout=5))
        except queue.Empty:
            failed = [p.name for p in procs if p.exitcode not in (None, 0)]
            if failed:
                for p in procs:
                    p.kill()
                raise SystemExit(f"{', '.join(failed)} failed: no GPU, or see its traceback above")
    for p in procs:
        p.join()
    gate_ends = [r for r in rows if r[0] == "gate"]
    ops = [r for r in rows if r[0] != "gate"]
    table = {}
    for (name, gate, ended), (_, _, gate_end) in zip(ops, gate_ends):
        # how long before the gate's end the candidate's operation ended (ms; > 0: it ran beside the gate)
        table.setdefault(f"{name} during a {gate} ms gate", []).append((gate_end - ended) / 1e6)
    summary = {k: {"median_ms_before_gate_end": round(statistics.median(v), 3), "max": round(max(v), 3)} for k, v in table.items()}
    for k, v in summary.items():
        print(f"{k:40s} {v}", flush=True)
    out = os.environ.get("OUT", "/tmp")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "context_overlap.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    mp.set_start_method("spawn")
    main()
