"""The host time of one forward on a GPU, eager against a candidate: plain, under the fallback
detector held around all of them as a server holds it for a phase (torch's profiler since stop 56,
and the Python dispatch mode it was before, side by side), with the guards armed; back to back and
after an idle gap (as a round starts).

    python scripts/forward_host_cost.py        # on a GPU machine, from the project root; writes $OUT/diag.json

Issue 34's fidelity gap: in a round the candidate's forward took 0.57 ms of host time to eager's
0.15 (gelu_cuda on level1/01_gelu, an H100). This says how much of it the detector and the guards
cost, and how much an idle CPU's cold start. A benchmark: it measures and asserts nothing.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from env_pool.candidate import guards  # noqa: E402
from env_pool.shared.arena import Arena  # noqa: E402
from scripts.bench_integrity import candidate_module  # noqa: E402
from scripts.launch_after_idle import idle, launch_times  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from tasks.loader import load_tasks  # noqa: E402
from tasks.task import build_problem  # noqa: E402
from tests.corpus_cases import CORPUS, files_of  # noqa: E402

CASE, TASK = "legit/gelu_cuda", "level1/01_gelu"
CALLS, SKIPPED = 60, 5  # calls per condition; the first few are left out of the medians
GAPS_S = (0.0, 0.02)  # back to back, and idle for about as long as a round's staging and freeze


def host_and_total_ms(model: torch.nn.Module, x: torch.Tensor, arena: Arena, gap_s: float) -> dict:
    """One forward's host time (its return) and its total (device synced), in ms, each after ``gap_s`` asleep."""
    def forward() -> torch.Tensor:
        with torch.no_grad(), arena.allocating():
            return model(x)

    return launch_times(forward, idle(gap_s, busy=False), CALLS, SKIPPED)


class DispatchModeDetector(TorchDispatchMode):
    """The fallback detector before stop 56: Python for every op that reaches the dispatcher's Python key."""

    def __init__(self, state: guards.GuardState):
        super().__init__()
        self.state = state

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in guards.ALLOWED_OPS:
            self.state.flag("torch_fallback", func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def main() -> None:
    work = Path(tempfile.mkdtemp())
    problem = build_problem({t.id: t for t in load_tasks()[0]}[TASK], "cuda")
    models = {"eager": problem.model_cls(*problem.get_init_inputs()).cuda().eval(), "candidate": candidate_module(files_of(CORPUS / CASE), work).ModelNew().cuda().eval()}
    torch.manual_seed(1)
    x = problem.get_inputs()[0].cuda()
    memory = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")  # the round's arena, as a server has one
    arena = Arena(memory.data_ptr(), memory.numel())
    plain = guards.GuardState(Path.cwd(), ())
    rows = {}

    def measure(name: str, model: torch.nn.Module, gap_s: float) -> None:
        rows[name] = host_and_total_ms(model, x, arena, gap_s)
        print(name, rows[name], flush=True)

    for gap in GAPS_S:
        for name, model in models.items():
            measure(f"{name} plain gap{gap}", model, gap)
            for kind, detector in (("profiler", guards.FallbackDetector), ("dispatch-mode", DispatchModeDetector)):
                with detector(plain):  # begun once for all the calls, as a server holds it for a phase
                    measure(f"{name} {kind}-held gap{gap}", model, gap)
    armed = guards.install(work / "scratch")  # the audit hook and import blocker, as a candidate's server arms them
    armed.armed = True
    for gap in GAPS_S:
        with guards.FallbackDetector(armed):
            measure(f"candidate profiler-held+armed gap{gap}", models["candidate"], gap)
    armed.armed = False
    (Path(os.environ.get("OUT", work)) / "diag.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
