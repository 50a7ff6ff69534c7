"""Where a warm evaluation's time goes inside the trusted harness: cProfile over its requests.

    python scripts/profile_harness.py [--backend cpp|cuda] [--runs 3] [--top 30] [key=value ...]

Runs the harness in this process (harness.handle, its task cache and server pools), not in the
worker's harness process, so cProfile sees it; everything else is the environment as an
EnvWorker runs it. Evaluates scripts/bench_env_speed.py's correct kernel once in full mode (cold:
the baselines), then ``--runs`` times each in verify and full mode, prints each request's time
and the profile of the warm full-mode requests. key=value pairs override env settings
(``warm_servers=6`` as the GPU presets). Trusted code only: a corpus kernel, not a candidate's.
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from env_pool.evaluate import evaluate  # noqa: E402
from env_pool.trusted import harness  # noqa: E402
from env_pool.trusted.harness_request import HarnessRequest  # noqa: E402
from scripts.bench_env_speed import KERNELS, case, context  # noqa: E402
from tasks.loader import load_tasks  # noqa: E402


class InProcessHarness:
    """The worker's harness as a plain object: each request handled here, profiled when asked."""

    def __init__(self) -> None:
        self.cache, self.pools = harness.TaskCache(), harness.ServerPools()
        self.profile: cProfile.Profile | None = None

    def request(self, request: HarnessRequest, limit: float) -> dict:
        begin = time.perf_counter()
        if self.profile is not None:
            self.profile.enable()
        try:
            return harness.handle(request.to_wire(), self.cache, self.pools)
        finally:
            if self.profile is not None:
                self.profile.disable()
            print(f"  harness request, {request.mode}{' + baselines' if request.baseline else ''}: "
                  f"{time.perf_counter() - begin:.2f} s", flush=True)

    def record(self, line: str) -> None:
        """The worker's own line (HarnessProcess writes it to harness.log): printed here."""
        print(f"  worker: {line}", flush=True)

    def close(self) -> None:
        self.pools.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="cpp", choices=sorted(KERNELS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("overrides", nargs="*", help="env settings, key=value")
    args = parser.parse_args()
    task, files = case(args, {t.id: t for t in load_tasks()[0]}, "good")
    ctx = context(args, Path(tempfile.mkdtemp(prefix="profile-harness-")))
    ctx._harness = inproc = InProcessHarness()
    warm_full = cProfile.Profile()
    try:
        for mode in ["full"] + ["verify", "full"] * args.runs:
            inproc.profile = warm_full if mode == "full" and ctx.baselines else None
            begin = time.perf_counter()
            result = asyncio.run(evaluate(ctx, task, files, mode))
            print(f"{mode}: {time.perf_counter() - begin:.2f} s, failure {result.failure}, warm server {result.warm_server}")
    finally:
        inproc.close()
    print(f"\nwarm full-mode requests ({args.runs}), by cumulative time:")
    pstats.Stats(warm_full).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
