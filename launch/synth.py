"""``cuda-agent synth``: build a training task set with the paper's pipeline (crawl, compose, filter, dedup, screen).

The driver crawls the operators (catalogue.json), composes candidates seed by seed (the
deterministic composer, or a policy given as ``synth.policy``), drops
those that fail the static checks, copy an accepted task or whose traced computation equals or
contains a KernelBench problem's, and hands the rest to ``synth.workers`` Ray workers (0: this
process) that size each to the runtime window's centre and run the dynamic filters (standalone,
eager, torch.compile, discrimination, distinct values, float64 stability, the runtime window).
Accepted tasks land in ``OUT/tasks/synth/``, a folder ``cuda-agent train`` and ``cuda-agent eval``
read unchanged. Every candidate's fate is a row of ``OUT/manifest.jsonl``; ``OUT/report.json``
(and ``report.html``) count each stage and filter with an example, and describe the accepted set,
also when the run is stopped (Ctrl-C, or ``cuda-agent jobs stop``: ``finished`` is then false).
A rerun continues.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from tasks.screen import ScreenResult
from tasks.synth.catalogue import crawl, write_catalogue
from tasks.synth.compose import Candidate, compose, sized
from tasks.synth.contamination import kernelbench_traces
from tasks.synth.filters import Demands, dynamic_problem
from tasks.synth.llm_compose import candidate_from, request
from tasks.synth.pipeline import SynthRun, task_of


REPORT_EVERY = 25  # screened candidates between two writes of report.json during a run


def _screen(candidate: Candidate, backend: str, window: tuple[float, float], try_compile: bool, target_ms: float,
            demands: Demands, workers: int = 0) -> tuple[Candidate, ScreenResult]:
    """In a worker: the candidate sized to the window's target, then every dynamic filter (one thread, as a cpp server runs)."""
    import torch

    torch.set_num_threads(1)
    try:
        candidate = sized(candidate, window, backend, target_ms, _enforce_gpu_share(backend, workers))
        return candidate, dynamic_problem(task_of(candidate), backend, window, try_compile, demands)
    except Exception as err:  # a program that breaks the filter itself is rejected, never the run
        broken = ScreenResult(candidate.id, backend)
        broken.problems.append(f"the screen failed: {type(err).__name__}: {str(err)[:300]}")
        return candidate, broken
    finally:
        if backend == "cuda" and torch.cuda.is_available():
            torch.cuda.empty_cache()  # the worker lives on: its cached blocks go back for the next screen


def _enforce_gpu_share(backend: str, workers: int) -> int:
    """The GPU memory (bytes) this screen may use: the device's over the workers that share it (0 off cuda).

    Enforced, not only aimed at: past it this process's allocator fails, so a candidate larger than
    its sizing measured runs out of its own share rather than its neighbours' screens."""
    import torch

    if backend != "cuda" or not torch.cuda.is_available():
        return 0
    share = 1.0 / max(1, workers)
    torch.cuda.set_per_process_memory_fraction(share)
    return int(torch.cuda.get_device_properties(0).total_memory * share)


def check_settings(s) -> None:
    """Refuse settings that cannot make a run, naming the field and the fix (ConfigError: one line from the CLI)."""
    from configs.load import ConfigError

    for name in ("window_ms_cpp", "window_ms_cuda"):
        window = list(getattr(s, name))
        if len(window) != 2 or not 0 < window[0] < window[1]:
            raise ConfigError(f"synth.{name}={window}: give [low, high] in ms with 0 < low < high, e.g. [1.0, 100.0]")
    for name, low in (("tasks", 1), ("max_candidates", 1), ("max_ops", 1), ("workers", 0), ("llm_concurrency", 1)):
        if int(getattr(s, name)) < low:
            raise ConfigError(f"synth.{name}={getattr(s, name)}: must be at least {low}")
    for name, example in (("duplicate_similarity", 0.9), ("contamination_score", 0.75)):
        if not 0 < float(getattr(s, name)) <= 1:
            raise ConfigError(f"synth.{name}={getattr(s, name)}: a similarity in (0, 1], e.g. {example}")
    if not 0 <= float(s.min_distinct) < 1:
        raise ConfigError(f"synth.min_distinct={s.min_distinct}: a share in [0, 1), e.g. 0.05")
    if float(s.min_spread) < 0:
        raise ConfigError(f"synth.min_spread={s.min_spread}: a number of tolerance widths, 0 or more, e.g. 10")
    if int(s.input_sets) < 2:
        raise ConfigError(f"synth.input_sets={s.input_sets}: at least 2 (the environment's env.correctness_inputs is 5)")


def run_synth(cfg, progress: bool = True, console: Console | None = None) -> dict:
    """The whole run; returns report.json's contents."""
    s = cfg.synth
    check_settings(s)
    console = console or Console(stderr=True)
    out = Path(s.out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    backend = str(s.backend)
    window = tuple(float(v) for v in (s.window_ms_cuda if backend == "cuda" else s.window_ms_cpp))
    ops, excluded = crawl()
    write_catalogue(out / "catalogue.json", ops, excluded)
    kb_root = Path(s.kernelbench_dir).expanduser().absolute()  # the report names where it looked
    with console.status(f"tracing KernelBench's problems in {kb_root} (cached in {s.trace_cache})"):
        kernelbench = kernelbench_traces(kb_root, Path(s.trace_cache).expanduser() if s.trace_cache else None)
    if not len(kernelbench):
        console.print(f"[yellow]KernelBench not found at {kb_root}: the contamination screen is skipped "
                      "(set synth.kernelbench_dir)[/yellow]")
    run = SynthRun(out, float(s.duplicate_similarity), kernelbench, float(s.contamination_score))
    demands = Demands(int(s.input_sets), bool(s.stable), float(s.min_distinct), float(s.min_spread))
    console.print(f"{len(ops)} operators ({len(excluded)} excluded: {out / 'catalogue.json'}); "
                  f"{run.accepted_count} task(s) already accepted in {out}")
    screener = _Screener(cfg, out, backend)
    composer = _LLMComposer(cfg, ops) if s.policy else (lambda seed: compose(seed, ops, int(s.max_ops)))
    began, composed, before = time.perf_counter(), 0, run.accepted_count
    pending: dict = {}
    seed = int(s.seed)

    def report(finished: bool) -> dict:
        return run.report({"backend": backend, "window_ms": list(window), "finished": finished,
                           "minutes": round((time.perf_counter() - began) / 60, 2),
                           "operators": len(ops), "operators_excluded": len(excluded),
                           "kernelbench_screen": str(kb_root) if len(kernelbench) else "skipped: not found",
                       "kernelbench_traced": len(kernelbench), "kernelbench_untraced": kernelbench.untraced,
                       "contamination_score": float(s.contamination_score), "input_sets": int(s.input_sets),
                       "min_distinct": float(s.min_distinct), "min_spread": float(s.min_spread), "stable": bool(s.stable), "try_compile": bool(s.try_compile),
                       "target_ms": float(s.target_ms) or round((window[0] * window[1]) ** 0.5, 3),
                           "task_folder": str(run.task_dir)})

    try:
        with _bar(progress, console, int(s.tasks)) as bar:
            task = bar.add_task("accepted", total=int(s.tasks), completed=run.accepted_count)
            while run.accepted_count < int(s.tasks) and (pending or composed < int(s.max_candidates)):
                while len(pending) < max(1, 2 * int(s.workers)) and composed < int(s.max_candidates):
                    while seed in run.seeds:  # composed in an earlier run: its row is in the manifest
                        seed += 1
                    candidate = composer(seed)
                    composed += 1
                    dropped = run.precheck(seed, candidate)
                    if dropped:
                        run.record(dropped)
                    else:
                        pending[screener.submit(candidate, window, bool(s.try_compile), float(s.target_ms), demands)] = seed
                    seed += 1
                if not pending:
                    continue
                ref, (candidate, screened) = screener.next_done(list(pending))
                run.record(run.finish(pending.pop(ref), candidate, screened))
                if len(run.rows) % REPORT_EVERY == 0:  # a run killed outright (SIGKILL, a lost node) still leaves a recent report
                    report(finished=False)
                bar.update(task, completed=run.accepted_count,
                           description=f"accepted ({len(run.rows)} candidates, {_rate(run.accepted_count - before, began)})")
    except BaseException:  # Ctrl-C, `jobs stop` (SIGINT) or an error: the report of what was done, then out
        report(finished=False)
        raise
    finally:  # at the target, on Ctrl-C or an error: what still runs is dropped (its seeds are redone next time)
        screener.close(list(pending))
        if isinstance(composer, _LLMComposer):
            composer.close()
    return report(finished=True)


class _LLMComposer:
    """Candidates written by a policy (synth.policy) from a prompt naming the operators to fuse (tasks/synth/llm_compose.py)."""

    def __init__(self, cfg, ops):
        from launch.embedded_model import resolve_policy
        from rollout.chat import ChatFormat
        from rollout.policy import make_policy

        self.cfg, self.ops = cfg, ops
        self.policy = make_policy(*resolve_policy(cfg.synth.policy, cfg))
        self.chat = ChatFormat.of(self.policy.tokenizer) if self.policy.token_level else None
        self.loop = asyncio.new_event_loop()
        self.ready: dict[int, Candidate | None] = {}

    def __call__(self, seed: int) -> Candidate | None:
        """The seed's candidate; the next ``synth.llm_concurrency`` seeds are asked for at once and kept."""
        if seed not in self.ready:
            seeds = range(seed, seed + int(self.cfg.synth.llm_concurrency))
            answers = self.loop.run_until_complete(self._ask_all(seeds))
            self.ready = dict(zip(seeds, answers))
        return self.ready.pop(seed)

    def close(self) -> None:
        self.loop.run_until_complete(self.policy.close())
        self.loop.close()

    async def _ask_all(self, seeds) -> list[Candidate | None]:
        return await asyncio.gather(*(self._ask(s) for s in seeds))

    async def _ask(self, seed: int) -> Candidate | None:
        from rollout.policy import GenerationRequest, PolicyError

        messages, provenance = request(seed, self.ops, int(self.cfg.synth.max_ops))
        ids = self.chat.render(messages) if self.chat is not None else []
        # One conversation per run: a scripted (replay) policy answers its turns in order.
        ask = GenerationRequest(ids, messages, [], int(self.cfg.synth.max_new_tokens), episode_id="synth")
        try:
            answer = await self.policy.generate(ask)
        except PolicyError:  # one unanswered request costs its candidate (a "compose" row), not the run
            return None
        return candidate_from(answer.text, {**provenance, "policy": self.cfg.synth.policy})


class _Screener:
    """The dynamic filters on ``synth.workers`` Ray workers (one CPU each, a GPU share on cuda), or in this process with 0.

    Ray is joined as train and eval join it (actors/topology.py start_cluster): a private cluster
    with ``cluster.address: local``, sized to the workers unless cluster.num_cpus says otherwise;
    the job's own cluster under ``cuda-agent submit``, where a private one would be a second
    cluster that cannot fetch the job's files."""

    def __init__(self, cfg, out: Path, backend: str):
        workers = int(cfg.synth.workers)
        self.backend, self.local, self.workers = backend, workers == 0, workers
        if self.local:
            self.results: dict[int, tuple] = {}
            return
        import ray
        from omegaconf import OmegaConf

        from actors.run_logs import ray_init_options
        from actors.topology import start_cluster

        self.started = not ray.is_initialized()  # Ray started here is shut down here (a caller's stays up)
        cluster = cfg.cluster
        if cluster.address == "local":  # a private cluster sized for the screens, where the config leaves it open
            import torch

            gpus = 1 if backend == "cuda" and torch.cuda.is_available() else 0
            cluster = OmegaConf.merge(cluster, {"num_cpus": workers if cluster.num_cpus is None else cluster.num_cpus,
                                                "num_gpus": gpus if cluster.num_gpus is None else cluster.num_gpus})
        start_cluster(cluster, ray_init_options(cfg.logging, out))
        self.remote = ray.remote(num_cpus=1, num_gpus=1.0 / workers if backend == "cuda" else 0)(_screen)

    def submit(self, candidate: Candidate, window: tuple[float, float], try_compile: bool, target_ms: float, demands: Demands):
        if self.local:
            key = len(self.results)
            self.results[key] = _screen(candidate, self.backend, window, try_compile, target_ms, demands)
            return key
        return self.remote.remote(candidate, self.backend, window, try_compile, target_ms, demands, self.workers)

    def next_done(self, pending: list):
        if self.local:
            return pending[0], self.results.pop(pending[0])
        import ray

        done, _ = ray.wait(pending, num_returns=1)
        return done[0], ray.get(done[0])

    def close(self, pending: list) -> None:
        """In-flight screens cancelled (their seeds are redone by a rerun), and Ray shut down if it was started here."""
        if self.local:
            return
        import ray

        for ref in pending:
            ray.cancel(ref, force=True)
        if self.started:
            ray.shutdown()


def _rate(accepted: int, began: float) -> str:
    minutes = (time.perf_counter() - began) / 60
    return f"{accepted / minutes:.1f}/min" if minutes > 0.05 else "-"


def _bar(progress: bool, console: Console, total: int) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} tasks"),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console, disable=not progress)
