"""The deterministic composer: chains of 1-5 compatible operators written as KernelBench-format programs.

A chain starts from an input layout (flat, seq or image) and draws each next operator among
those that accept the current tensor; the shape after each step is found by running the step
on a small probe tensor (never by tracing on the meta device). Hyperparameters are drawn from
the recipe's choices. The batch size is set later (``sized``, in the worker that then checks
the runtime window, on the backend's device) so that the eager forward falls inside the window.

Each candidate comes from one integer seed: the same seed gives the same program, so a resumed
run skips the seeds its manifest already holds.
"""
from __future__ import annotations

import math
import random
import re
import time
from dataclasses import dataclass, field

import torch

from tasks.synth.catalogue import Op, fill, run_op

# Per-sample sizes of each layout (the batch dimension is sized later); chosen so that a
# chain's work is dominated by its operators, not the launch overhead.
SAMPLE_SHAPES = {"flat": [(1024,), (2048,), (4096,)], "seq": [(64, 256), (128, 512)], "image": [(16, 32, 32), (32, 64, 64)]}
# No tensor of a chain may exceed this many elements at the sized batch: 256 MB of float32 on a
# CPU; 2 GiB on a GPU, where at 256 MB (an H100, 2026-11-27) 29 of 50 chains ran in 0.1-1 ms, under
# the window, and the accepted ones in 1.0-2.3 ms against the 10 ms aimed at.
MAX_ELEMENTS = {"cpu": 1 << 26, "cuda": 1 << 29}
# On a GPU the screen holds several times one float32 forward's peak at once: the float64 twin's
# forward (twice it), the outputs of the input sets it compares, torch.compile's buffers. A batch
# whose forward peaks above the worker's share over this factor is cut down to fit (an H100's synth
# run of 2026-11-27, 4 workers: 47 of 59 candidates failed their screen out of memory, one worker's
# cache holding 58 GiB). For one pointwise operator (a forward's peak: its input and output) a set's
# float64 check alone holds about five peaks (both in float64, the comparison's temporaries) beside
# the first set's: at 6, 2 of 18 candidates of the H100 run after the sizing fix still ran out.
SCREEN_MEMORY_FACTOR = 8
DOUBLINGS = 40  # more than MAX_ELEMENTS allows: the element cap, not this count, ends a cheap chain's doubling
SIZE_ROUNDS = 6  # measurements at the chosen batch, each rescaling it toward the target
SIZE_SLACK = 1.5  # a batch whose time is within this factor of the target is kept
CUDA_BATCH_FACTOR = 16  # the cuda preset's batch over the cpp one: a GPU runs the same chain ~10-100x faster


@dataclass
class Candidate:
    """A composed program before the filters: its source and where it came from."""

    id: str
    source: str
    provenance: dict = field(default_factory=dict)  # composer, seed, ops, layout; written beside the task


def compose(seed: int, ops: list[Op], max_ops: int = 5) -> Candidate | None:
    """One candidate program from ``seed``; None when no chain could be built from it."""
    rng = random.Random(seed)
    layout = rng.choice(sorted(SAMPLE_SHAPES))
    sample = rng.choice(SAMPLE_SHAPES[layout])
    chain = _chain(rng, ops, layout, sample, rng.randint(1, max_ops))
    if not chain:
        return None
    names = [op.name for op, _ in chain]
    return Candidate(id=f"synth/{seed:08d}_{'_'.join(_short(n) for n in names)}"[:120],
                     source=_program(seed, layout, sample, chain, batch=1),
                     provenance={"composer": "deterministic", "seed": seed, "ops": names, "layout": layout,
                                 "sample_shape": list(sample)})


def chain_of(names: list[str], ops: list[Op], layout: str = "flat", sample: tuple[int, ...] = (4096,),
             params: dict | None = None, seed: int = 0) -> Candidate:
    """The candidate that applies the named operators in order (each with its first hyperparameters unless
    ``params`` names them): a reported task rebuilt, or a known chain for a test."""
    by_name = {op.name: op for op in ops}
    x = torch.randn(2, *sample)
    chain = []
    for name in names:
        op = by_name[name]
        values = {k: v[0] for k, v in op.params.items()} | (params or {}).get(name, {})
        chain.append((op, {**values, "_in_shape": tuple(x.shape)}))
        x = run_op(op, x, values)
    return Candidate(id=f"synth/chain_{'_'.join(_short(n) for n in names)}"[:120],
                     source=_program(seed, layout, sample, chain, batch=1),
                     provenance={"composer": "chain_of", "seed": seed, "ops": list(names), "layout": layout,
                                 "sample_shape": list(sample)})


def sized(candidate: Candidate, window_ms: tuple[float, float], backend: str = "cpp", target_ms: float = 0.0,
          memory_bytes: int = 0) -> Candidate:
    """The candidate with the batch size that puts its eager forward at ``target_ms`` (0: the window's geometric middle).

    Measured where the window is then checked (a screen worker, one thread): a size measured in
    another process on a busy machine missed the window by 100x either way. The time measured at
    the chosen batch is recorded (``eager_ms_sized``), so a task's distance from the edges is known.
    ``memory_bytes`` (cuda): the GPU memory the screen may use; the batch is capped so that its
    forward's measured peak stays under a SCREEN_MEMORY_FACTOR-th of it (0: no cap but MAX_ELEMENTS).
    """
    scope: dict = {}
    exec(compile(candidate.source, candidate.id, "exec", dont_inherit=True), scope)
    torch.manual_seed(0)
    device = "cuda" if backend == "cuda" else "cpu"
    model = scope["Model"]().to(device).eval()
    sample = tuple(candidate.provenance["sample_shape"])
    target = target_ms or (window_ms[0] * window_ms[1]) ** 0.5
    measured, eager_ms = _sized_batch(model, sample, target, device, memory_bytes)
    # The backend measured here sets its own preset; the other one's is scaled by the usual GPU/CPU ratio.
    batch = measured if device == "cpu" else max(1, measured // CUDA_BATCH_FACTOR)
    cuda_batch = measured if device == "cuda" else batch * CUDA_BATCH_FACTOR
    source = re.sub(r"(?m)^batch_size = .*$", f"batch_size = {batch}", candidate.source)
    source = re.sub(r"(?m)^PRESETS = .*$", _presets_line(batch, cuda_batch), source)
    return Candidate(candidate.id, source, {**candidate.provenance, "batch_cpp": batch, "batch_cuda": cuda_batch,
                                            "sized_on": backend, "target_ms": round(target, 3),
                                            "eager_ms_sized": round(eager_ms, 3)})


def _presets_line(batch: int, cuda_batch: int) -> str:
    return f'PRESETS = {{"cpp": {{"batch_size": {batch}}}, "cuda": {{"batch_size": {cuda_batch}}}}}'



def _chain(rng: random.Random, ops: list[Op], layout: str, sample: tuple[int, ...], length: int) -> list[tuple[Op, dict]]:
    x = torch.randn(2, *sample)
    chain: list[tuple[Op, dict]] = []
    for _ in range(length * 4):  # a few draws per step: some operators fail on some shapes
        if len(chain) == length:
            break
        current = _layout_of(x)
        usable = [op for op in ops if current in op.layouts and not (op.first_only and chain)]
        if not usable:
            break
        op = rng.choices(usable, weights=[o.weight for o in usable])[0]
        params = {k: rng.choice(v) for k, v in op.params.items()}
        if any(existing.name == op.name for existing, _ in chain[-1:]):
            continue  # the same operator twice in a row adds nothing a kernel writer must think about
        try:
            y = run_op(op, x, params)
        except Exception:
            continue
        if not isinstance(y, torch.Tensor) or y.dim() < 2 or y.numel() < 2 or not torch.isfinite(y).all():
            continue
        chain.append((op, {**params, "_in_shape": tuple(x.shape)}))
        x = y
    return chain


def _layout_of(x: torch.Tensor) -> str:
    return {2: "flat", 3: "seq", 4: "image"}.get(x.dim(), "none")


def _short(name: str) -> str:
    return name.split(".")[-1].lower().removesuffix("activation")[:12]


def _program(seed: int, layout: str, sample: tuple[int, ...], chain: list[tuple[Op, dict]], batch: int) -> str:
    dims = ", ".join(str(d) for d in sample)
    preludes = "".join(f"\n\n{text}" for text in dict.fromkeys(op.prelude for op, _ in chain if op.prelude))
    imports = "".join(dict.fromkeys(line for op, _ in chain for line in op.imports.splitlines(keepends=True)))
    init_lines, forward_lines = [], []
    for i, (op, params) in enumerate(chain):
        shape = params["_in_shape"]
        values = {k: v for k, v in params.items() if not k.startswith("_")}
        attr = f"op{i}"
        if op.init:
            init_lines.append(f"        self.{attr} = {fill(op.init, shape, values)}")
        forward_lines.append(f"        x = {fill(op.call, shape, values).replace('{attr}', attr)}  # {op.name}")
    names = " -> ".join(op.name for op, _ in chain)
    return f'''"""Synthesised task: {names}.

Composer: deterministic, seed {seed}; input layout {layout}. Write a kernel (or kernels) that
computes the same forward pass.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
{imports}
batch_size = {batch}
{_presets_line(batch, batch * CUDA_BATCH_FACTOR)}{preludes}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
{chr(10).join(init_lines) if init_lines else "        pass"}

    def forward(self, x):
{chr(10).join(forward_lines)}
        return x


def get_inputs():
    return [torch.randn(batch_size, {dims})]


def get_init_inputs():
    return []


if __name__ == "__main__":  # `python task.py`: the program runs on its own
    model = Model(*get_init_inputs()).eval()
    with torch.no_grad():
        print(tuple(model(*get_inputs()).shape))
'''


def _sized_batch(model: torch.nn.Module, sample: tuple[int, ...], target: float, device: str,
                 memory_bytes: int = 0) -> tuple[int, float]:
    """(the batch whose eager forward takes about ``target`` ms, the time measured at it)."""
    tried: dict[int, float] = {}  # batch -> its measured ms
    batch = 1
    for _ in range(DOUBLINGS):  # doubled until a call takes a quarter of the target or the next would not fit, then scaled
        x = torch.randn(batch, *sample, device=device)
        ms, y = _eager_ms(model, x)
        tried[batch] = ms
        peak = _peak_bytes(model, x) if memory_bytes and x.is_cuda else 0
        # Stop at a quarter of the target, or where the next doubling would pass the element cap or
        # take more than the screen's share of GPU memory allows.
        if ms >= target / 4 or max(x.numel(), y.numel()) * 2 > MAX_ELEMENTS[device] or 2 * peak > memory_bytes / SCREEN_MEMORY_FACTOR:
            break
        batch *= 2
    # The batch last measured: a loop that ran out of doublings had doubled past it, and the caps
    # below, scaled from it, came out twice too large (on an H100, where 16 doublings could not
    # reach a cheap chain's target, screens went out of memory and sizes stopped at 1 ms).
    batch = x.shape[0]
    cap = max(1, int(MAX_ELEMENTS[device] // max(max(x.numel(), y.numel()) / batch, 1)))
    if peak:
        cap = min(cap, max(1, int(memory_bytes / SCREEN_MEMORY_FACTOR * batch / peak)))
        if batch > cap:  # the batches measured past the cap are out of the running, and the cap is measured
            tried = {b: t for b, t in tried.items() if b <= cap}
            batch = cap
            ms, _ = _eager_ms(model, torch.randn(batch, *sample, device=device))
            tried[batch] = ms
    # Time is not linear in the batch: a small batch runs from the caches, a large one pays DRAM and
    # page faults (relu then softsign took 30x longer per sample at 51M elements than at 1M), so a
    # linear guess from a small batch missed by 10-30x (issue 36: tasks sized for 10 ms ran in 1 ms).
    # Each guess is measured; one that leaves the bracket of batches known too fast and too slow is
    # replaced by the bracket's geometric middle; the batch measured closest to the target is kept.
    for _ in range(SIZE_ROUNDS):
        if target / SIZE_SLACK <= ms <= target * SIZE_SLACK:
            break
        fast = [b for b, t in tried.items() if t < target]
        slow = [b for b, t in tried.items() if t > target]
        low, high = max(fast, default=0), min(slow, default=cap + 1)
        guess = int(batch * target / max(ms, 1e-3))
        if not low < guess < high:
            guess = int((max(low, 1) * min(high, cap)) ** 0.5)
        guess = max(1, min(cap, guess))
        if guess in tried:
            break
        batch = guess
        ms, _ = _eager_ms(model, torch.randn(batch, *sample, device=device))
        tried[batch] = ms
    best = min(tried, key=lambda b: abs(math.log(max(tried[b], 1e-6) / target)))
    return best, tried[best]


def _peak_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """The GPU memory one forward on ``x`` takes at its peak, ``x`` included (the weights are not)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with torch.no_grad():
        model(x)
    return torch.cuda.max_memory_allocated() - before + x.numel() * x.element_size()


def _eager_ms(model: torch.nn.Module, x: torch.Tensor) -> tuple[float, torch.Tensor]:
    """The fastest of five timed calls after a warm-up (the first call pays allocation and dispatch set-up).

    The fastest, not the median: on a shared machine a neighbour's work only ever adds time, and the
    median of five was seen 10x above the quiet time (load 6 on 2 cores), which sized batches 10x too small."""
    with torch.no_grad():
        y = model(x)
        times = []
        for _ in range(5):
            synchronize = torch.cuda.synchronize if x.is_cuda else (lambda: None)
            synchronize()
            begin = time.perf_counter()
            model(x)
            synchronize()
            times.append((time.perf_counter() - begin) * 1e3)
    return min(times), y
