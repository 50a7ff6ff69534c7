"""`cuda-agent`: the command line. Each subcommand is a thin call into the package that owns the work."""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

console = Console()
err_console = Console(stderr=True, soft_wrap=True)  # errors stay on one line for grep and logs


def _split_files_and_overrides(items: list[str]) -> tuple[list[str], list[str]]:
    files = [i for i in items if "=" not in i]
    return files, [i for i in items if "=" in i]


def _run_config(files: list[str], overrides: list[str]):
    """The config of a command that runs something; our loggers take its logging.level."""
    from actors.run_logs import set_log_level
    from configs.load import load_config

    cfg = load_config(files, overrides)
    set_log_level(cfg.logging.level)
    return cfg


def _point_at_worker_output(cfg, run_dir, since: float) -> None:
    """A run begun at ``since`` failed: where its Ray workers' output went (logging.actor_logs=file), and
    their last traceback."""
    from actors.run_logs import failure_report

    if str(getattr(cfg.logging.actor_logs, "value", cfg.logging.actor_logs)) == "file":
        report = failure_report(run_dir, since)
        if report:
            err_console.print(report, markup=False, highlight=False)


def cmd_config_show(args: argparse.Namespace) -> int:
    from configs.document import render
    from configs.load import load_config

    files, overrides = _split_files_and_overrides(args.items)
    cfg = load_config(files, overrides, require_complete=False)
    print(render(cfg), end="")
    return 0


def cmd_config_defaults(args: argparse.Namespace) -> int:
    from configs.document import render
    from configs.load import load_config

    print("# cuda-agent defaults: generated from configs/schema.py by `cuda-agent config defaults`; edit the schema, not this file.")
    print(render(load_config()), end="")
    return 0


def cmd_tasks_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    from tasks.describe import describe_task
    from tasks.loader import load_tasks

    tasks, failures = load_tasks(args.paths)
    rows = []
    for task in tasks:
        shape = describe_task(task, args.backend)
        rows.append({"id": task.id, "level": task.level, "entry": asdict(task.entry), "dtype": shape.dtype,
                     "inputs": shape.inputs, "init_inputs": shape.init_inputs, "path": task.path})
    if args.json:
        print(json.dumps({"tasks": rows, "failures": [asdict(f) for f in failures]}, indent=2))
        return 1 if failures else 0
    table = Table(title=f"{len(tasks)} tasks ({args.backend} shapes)")
    for col in ("id", "level", "entry points", "inputs", "init inputs"):
        table.add_column(col)
    for row in rows:
        e = row["entry"]
        table.add_row(row["id"], str(row["level"] or "-"), f"{e['model']}, {e['inputs']}, {e['init_inputs']}",
                      "\n".join(row["inputs"]), ", ".join(row["init_inputs"]) or "-")
    console.print(table)
    for failure in failures:
        console.print(f"[red]failed[/red] {failure.path}: {failure.reason}")
    return 1 if failures else 0


def cmd_tasks_check(args: argparse.Namespace) -> int:
    import torch
    from rich.progress import track
    from rich.table import Table

    from tasks.loader import load_tasks
    from tasks.screen import screen_task

    if args.threads:
        torch.set_num_threads(args.threads)
    tasks, failures = load_tasks(args.paths)
    results = []
    for task in track(tasks, description="running references", console=err_console, disable=args.json or args.jsonl):
        results.append(screen_task(task, args.backend, window_ms=(args.min_ms, args.max_ms), try_compile=args.compile,
                                   timed=not args.sets_only))
        if args.jsonl:  # a line per task as it is done: a long check cut short keeps what it found
            print(json.dumps(asdict(results[-1])), flush=True)
    if args.jsonl:
        return 0 if all(r.ok for r in results) and not failures else 1
    if args.json:
        print(json.dumps({"results": [asdict(r) for r in results], "failures": [asdict(f) for f in failures]}, indent=2))
    else:
        table = Table(title=f"reference screen: {args.backend}, {torch.get_num_threads()} thread(s)")
        for col in ("id", "eager ms", "torch.compile", "verification sets", "verdict"):
            table.add_column(col)
        for r in results:
            compiled = "-" if r.compile_ok is None else ("ok" if r.compile_ok else "fails")
            verdict = "[green]ok[/green]" if r.ok else "[red]" + "; ".join(r.problems) + "[/red]"
            sets = "own" + "".join(f" + {name}" for name in r.verification_sets)
            table.add_row(r.task_id, f"{r.eager_ms:.2f}" if r.eager_ms is not None else "-", compiled, sets, verdict)
        console.print(table)
        extra = [r for r in results if r.verification_sets]
        if extra:
            console.print(f"{len(extra)} task(s) need transformed verification sets (a trivial kernel passes their own "
                          "inputs; the environment adds the sets named): " + ", ".join(r.task_id for r in extra))
        for failure in failures:
            console.print(f"[red]failed to load[/red] {failure.path}: {failure.reason}")
    return 0 if all(r.ok for r in results) and not failures else 1


def cmd_doctor(args: argparse.Namespace) -> int:
    from configs.load import load_config
    from launch.doctor import diagnose, print_report

    files, overrides = _split_files_and_overrides(args.items)
    report = diagnose(load_config(files, overrides), " ".join(args.items) or "defaults")
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print_report(report)
    return 0 if report.ok else 1


def cmd_model_prepare(args: argparse.Namespace) -> int:
    from configs.load import load_config
    from launch.embedded_model import embedded_model_dir, is_prepared, prepare_embedded_model

    cache_dir = args.cache_dir or load_config().model.cache_dir
    if is_prepared(cache_dir):
        console.print(f"embedded model already prepared: {embedded_model_dir(cache_dir)}")
        return 0
    with console.status("converting SmolLM2-135M-Instruct (GGUF -> bf16 Hugging Face folder) and test-generating"):
        path = prepare_embedded_model(cache_dir)
    console.print(f"embedded model ready: {path}")
    return 0


def cmd_env_eval(args: argparse.Namespace) -> int:
    import asyncio

    from omegaconf import OmegaConf

    from env_pool.pool import EnvPool
    from launch.report import print_eval_result
    from tasks.task import TaskError

    # Folders and key=value overrides in any order (after --json too): an override has a "=".
    folders, overrides = _split_files_and_overrides(args.solutions + args.overrides)
    cfg = _run_config(args.config or [], overrides)
    task = _find_task(args.task, args.tasks)
    solutions = []
    for name in folders:
        folder = Path(name)
        if not folder.is_dir():
            raise TaskError(f"solution folder {name!r} does not exist (or is not a folder): give the folder that "
                            "holds model_new.py")
        solutions.append((name, {p.name: p.read_text() for p in sorted(folder.iterdir()) if p.is_file()}))
    pool = EnvPool(OmegaConf.to_container(cfg.env, enum_to_str=True))
    _end_with_the_command(pool)

    async def evaluate_in_turn() -> list:
        results = []
        for name, files in solutions:  # one pool: its harness, servers and the task's baselines stay warm
            with console.status(f"evaluating {name} on {task.id} ({args.mode})"):
                results.append(await pool.evaluate(task, files, args.mode))
            if not args.json and len(solutions) > 1:
                console.print(f"[bold]{name}[/bold]")
            if not args.json:
                print_eval_result(results[-1], console)
        return results

    results = asyncio.run(evaluate_in_turn())
    pool.close()
    if args.json:
        rows = [result.to_dict() for result in results]
        print(json.dumps(rows[0] if len(rows) == 1 else [{"solution": n, **r} for (n, _), r in zip(solutions, rows)], indent=2))
    return 0 if all(result.failure is None for result in results) else 1


def _end_with_the_command(pool) -> None:
    """Ctrl-C, SIGTERM or a closed terminal end the command now, and what it started with it.

    Python's own KeyboardInterrupt would first wait for the evaluation's threads (a load_inline
    build runs minutes in one); exiting from the handler instead kills those threads, and with
    them the sandboxed runs they started (each shim dies with its thread), and the harness is
    killed here (it would also end by itself once its stdin closes). The precompiled header's
    job alone goes on: it is the machine's, not this command's (env_pool/inline_pch.py).
    """
    import os
    import signal

    def end(signum, _frame) -> None:
        err_console.print(f"interrupted ({signal.Signals(signum).name}): the evaluation and everything it started are ended")
        pool.close()
        os._exit(128 + signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, end)


def _find_task(name: str, paths: list[str] | None):
    """A task by id (as `tasks list` shows it, or its tail), or by the path of a problem file."""
    from tasks.loader import load_task_file, load_tasks
    from tasks.task import TaskError

    if name.endswith(".py") or Path(name).is_file():
        if not Path(name).is_file():
            raise TaskError(f"problem file {name!r} does not exist")
        return load_task_file(Path(name))
    tasks, _ = load_tasks(paths or [])
    match = [t for t in tasks if t.id == name or t.id.endswith("/" + name)]
    if len(match) != 1:
        raise TaskError(f"task {name!r} matches {len(match)} of {len(tasks)} loaded tasks; give its id as `cuda-agent tasks list` shows it")
    return match[0]


def cmd_episode(args: argparse.Namespace) -> int:
    import asyncio

    from actors.run_logs import quiet_libraries

    overrides = list(args.overrides) + ([f"env.backend={args.backend}"] if args.backend else [])
    overrides += [f"rollout.max_turns={args.max_turns}"] if args.max_turns else []
    cfg = _run_config(args.config or [], overrides)
    # The engine runs in this process here, not in an actor: quieted as the actors are, before
    # vLLM and transformers are imported (they read their levels then).
    if str(getattr(cfg.logging.actor_logs, "value", cfg.logging.actor_logs)) == "file":
        quiet_libraries()
    from launch.episode import run_single_episode
    from launch.report import print_transcript

    task = _find_task(args.task, args.tasks)
    traj, out = asyncio.run(run_single_episode(cfg, task, args.policy, args.out, progress=not args.quiet))
    print_transcript(traj, console)
    console.print(f"trajectory saved to {out}")
    return 0 if traj.stop_reason != "error" else 1


def cmd_train(args: argparse.Namespace) -> int:
    from launch.train import train

    cfg = _run_config(*_split_files_and_overrides(args.items))
    started = time.time()
    try:
        out = train(cfg)
    except KeyboardInterrupt:
        err_console.print(f"interrupted: a checkpoint was saved in {cfg.logging.out_dir}; run the same command to resume")
        return 130
    except Exception:
        _point_at_worker_output(cfg, cfg.logging.out_dir, started)
        raise
    from launch.report import print_training_summary

    print_training_summary(out, console)
    console.print(f"done: metrics, plots and checkpoints in {out}")
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    from launch.synth import run_synth

    cfg = _run_config(*_split_files_and_overrides(args.items))
    try:
        report = run_synth(cfg, progress=cfg.logging.progress)
    except KeyboardInterrupt:
        err_console.print(f"interrupted: every finished candidate is in {cfg.synth.out_dir}/manifest.jsonl, the counts "
                          "in report.json; run the same command to continue")
        return 130
    from rich.table import Table

    table = Table(title=f"synth: {report['candidates']} candidates in {report['minutes']} min")
    table.add_column("stage")
    table.add_column("candidates", justify="right")
    for stage, count in report["stages"].items():
        table.add_row(stage, str(count))
    console.print(table)
    console.print(f"tasks: {report['task_folder']} (cuda-agent train/eval read it as is); manifest and report.json beside it")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from launch.eval import build_sweep, run_sweep, write_report_of
    from tasks.task import TaskError

    files, overrides = _split_files_and_overrides(args.items)
    # --tasks takes several values, so overrides typed after it land there: give them back.
    overrides += [t for t in args.tasks or [] if "=" in t and not Path(t).exists()]
    args.tasks = [t for t in args.tasks or [] if t not in overrides] or None
    cfg = _run_config(files, overrides)
    if args.solutions and args.policy:
        raise TaskError("give --policy (run agents) or --solutions (score existing kernels), not both")
    from configs.load import under_root

    sweep = build_sweep(cfg, args.policy, args.tasks, args.out and under_root(cfg, args.out), args.solutions)
    if args.report_only:  # a stopped sweep's report, for the problems it finished
        if not write_report_of(sweep):
            raise TaskError(f"no finished episodes of these problems in {sweep.out}/results.jsonl: nothing to report")
        return _print_eval_summary(sweep.out, sweep.policy)
    console.print(f"evaluating {len(sweep.tasks)} problem(s) x {sweep.samples} sample(s) with {sweep.policy}; "
                  f"results in {sweep.out}")
    started = time.time()
    try:
        out = run_sweep(sweep, progress=cfg.logging.progress and not args.quiet, console=err_console)
    except KeyboardInterrupt:
        err_console.print(f"interrupted: finished episodes are in {sweep.out}/results.jsonl; run the same command to "
                          "continue, or add --report-only for a report of them")
        return 130
    except Exception:
        _point_at_worker_output(cfg, sweep.out, started)
        raise
    return _print_eval_summary(out, sweep.policy)


def _print_eval_summary(out: Path, policy: str) -> int:
    from launch.eval_report import headline_rows

    summary_path = out / "summary.json"
    if summary_path.exists():
        from rich.table import Table

        header, rows = headline_rows(json.loads(summary_path.read_text()))
        table = Table(title=f"evaluation: {policy}")
        for col in header:
            table.add_column(col)
        for row in rows:
            table.add_row(*row)
        console.print(table)
    console.print(f"report: {out / 'report.md'} and {out / 'report.html'}")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from launch.jobs import COMMANDS, submit

    items = list(args.items)
    command = items.pop(0) if items and items[0] in COMMANDS else "train"
    # --tasks takes several values, so overrides typed after it land there: give them back (as eval does).
    items += [t for t in args.tasks or [] if "=" in t and not Path(t).exists()]
    tasks = [t for t in args.tasks or [] if t not in items] or None
    job_id, run_dir = submit(command, items, args.address, args.policy, tasks, args.solutions, args.out)
    console.print(f"submitted {command} as job [bold]{job_id}[/bold]; its run folder: {run_dir} (on the driver's node)")
    console.print(f"follow it: cuda-agent jobs logs {job_id} --follow; stop it (a checkpoint is saved): "
                  f"cuda-agent jobs stop {job_id}; submit the same command again to resume")
    if args.follow:
        from launch.jobs import logs

        status = logs(job_id, args.address, follow=True)
        console.print(f"job {job_id}: {status}")
        return 0 if status == "SUCCEEDED" else 1
    return 0


def cmd_jobs_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    from launch.jobs import list_jobs

    rows = list_jobs(args.address)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title=f"{len(rows)} job(s)")
    for col in ("id", "status", "command", "run folder", "started", "ended"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["id"], r["status"], f"{r['command']} {r['config']}".strip(), r["run_dir"], r["start"], r["end"])
    console.print(table)
    return 0


def cmd_jobs_logs(args: argparse.Namespace) -> int:
    from launch.jobs import logs

    status = logs(args.job_id, args.address, follow=args.follow)
    if args.follow:
        err_console.print(f"job {args.job_id}: {status}")
    return 0


def cmd_jobs_stop(args: argparse.Namespace) -> int:
    from launch.jobs import stop

    status = stop(args.job_id, args.address, args.wait)
    console.print(f"job {args.job_id}: {status}" + ("" if status in ("STOPPED", "SUCCEEDED", "FAILED") else
                                                      " (stopping: its driver saves a checkpoint first)"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cuda-agent", description="Train and evaluate LLM agents that write fast kernels.")
    sub = parser.add_subparsers(dest="command", required=True)

    config = sub.add_parser("config", help="inspect configs").add_subparsers(dest="action", required=True)
    show = config.add_parser("show", help="print the resolved config: FILES (paths or shipped names) then key=value overrides")
    show.add_argument("items", nargs="*", metavar="FILE|key=value")
    show.set_defaults(func=cmd_config_show)
    config.add_parser("defaults", help="print the documented defaults (the source of configs/defaults.yaml)").set_defaults(
        func=cmd_config_defaults)

    tasks = sub.add_parser("tasks", help="KernelBench-format task sets").add_subparsers(dest="action", required=True)
    for name, func, text in (("list", cmd_tasks_list, "table of tasks with levels, entry points and input shapes"),
                             ("check", cmd_tasks_check, "run each reference: deterministic, input-dependent, runtime window, and which verification sets tell a trivial kernel from a correct one")):
        p = tasks.add_parser(name, help=text)
        p.add_argument("paths", nargs="*", help="problem files or folders (default: the shipped starter set)")
        p.add_argument("--backend", choices=["cpp", "cuda"], default="cpp", help="which shape preset (default cpp)")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=func)
        if name == "check":
            p.add_argument("--compile", action="store_true", help="also check that torch.compile runs and agrees")
            p.add_argument("--jsonl", action="store_true", help="one JSON line per task as it is checked")
            p.add_argument("--sets-only", action="store_true",
                           help="only the outputs' checks and the verification sets each task needs (no runtime window)")
            p.add_argument("--threads", type=int, default=1, help="torch threads while timing (default 1)")
            p.add_argument("--min-ms", type=float, default=1.0, help="fastest acceptable eager time")
            p.add_argument("--max-ms", type=float, default=100.0, help="slowest acceptable eager time")

    env = sub.add_parser("env", help="the kernel environment").add_subparsers(dest="action", required=True)
    ev = env.add_parser("eval", help="compile, verify and profile solution folders (model_new.py [+ kernel.cpp|kernel.cu])",
                        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=(
                            "Each command starts the environment cold (its harness, servers and the task's baselines: "
                            "~17 s on 2 CPUs,\nagainst ~1.6 s warm): give several folders to one command, or score many "
                            "problems with\n`cuda-agent eval --solutions DIR`, to keep it warm. Nothing the command starts "
                            "outlives it, but\nthe precompiled torch/extension.h for load_inline builds: built once per "
                            "machine by a job of its\nown (env.pch_dir; its log beside it)."))
    ev.add_argument("task", help="task id, e.g. level1/03_softmax (see `cuda-agent tasks list`)")
    ev.add_argument("solutions", nargs="+", metavar="FOLDER",
                    help="folder(s) with model_new.py and its kernel sources, evaluated in turn by one environment")
    ev.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. env.backend=cuda")
    ev.add_argument("--config", action="append", help="config file(s) under the overrides")
    ev.add_argument("--tasks", action="append", help="task files or folders (default: the starter set)")
    ev.add_argument("--mode", choices=["compile", "verify", "full"], default="full")
    ev.add_argument("--json", action="store_true")
    ev.set_defaults(func=cmd_env_eval)

    ep = sub.add_parser("episode", help="run one agent episode on a task and print its transcript")
    ep.add_argument("task", help="task id, e.g. level1/01_gelu (see `cuda-agent tasks list`)")
    ep.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. rollout.temperature=0.7")
    ep.add_argument("--policy", default="vllm:embedded", help="vllm:MODEL_DIR (embedded: SmolLM2), openai:URL[#model], or replay:FILE")
    ep.add_argument("--backend", choices=["cpp", "cuda"], help="kernel backend (default: env.backend)")
    ep.add_argument("--max-turns", type=int, help="turn budget (default: rollout.max_turns)")
    ep.add_argument("--out", help="where to save the trajectory (msgpack); default: logging.out_dir/episodes/")
    ep.add_argument("--config", action="append", help="config file(s) under the overrides")
    ep.add_argument("--tasks", action="append", help="task files or folders (default: the starter set)")
    ep.add_argument("--quiet", action="store_true", help="no live status line")
    ep.set_defaults(func=cmd_episode)

    evp = sub.add_parser("eval", help="an evaluation sweep (agents, or existing kernels) and its report: CONFIG files then "
                         "key=value overrides", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=(
                             "--solutions DIR reads, per problem: DIR/TASK_ID/ or DIR/NAME/ holding model_new.py (and its "
                             "kernel sources), DIR/TASK_ID.py or DIR/NAME.py defining ModelNew, or KernelBench's "
                             "level_L_problem_P_sample_S_kernel.py.\nRerunning the same command continues a stopped sweep."))
    evp.add_argument("items", nargs="*", metavar="FILE|key=value", help="e.g. cpu-demo eval.samples_per_task=4")
    evp.add_argument("--policy", help="vllm:MODEL_DIR, vllm:embedded, openai:URL#MODEL or replay:FILE|DIR (default: eval.policy)")
    evp.add_argument("--tasks", nargs="+", help="problem files or folders (default: eval.tasks, else the starter set)")
    evp.add_argument("--solutions", metavar="DIR", help="score existing solutions in DIR instead of running a policy")
    evp.add_argument("--out", help="output folder (default: eval.out_dir)")
    evp.add_argument("--quiet", action="store_true", help="no live progress display")
    evp.add_argument("--report-only", action="store_true", help="run nothing: write the report of the episodes "
                     "already finished in the output folder (a stopped sweep's)")
    evp.set_defaults(func=cmd_eval)

    tr = sub.add_parser("train", help="run a training stage or the whole recipe: CONFIG files then key=value overrides")
    tr.add_argument("items", nargs="*", metavar="FILE|key=value", help="e.g. cpu-demo stage.name=agentic_ppo stage.steps=20")
    tr.set_defaults(func=cmd_train)

    sy = sub.add_parser("synth", help="build a training task set (crawl, compose, filter, dedup, screen): CONFIG files then key=value overrides")
    sy.add_argument("items", nargs="*", metavar="FILE|key=value", help="e.g. synth.tasks=300 synth.out_dir=runs/synth")
    sy.set_defaults(func=cmd_synth)

    sb = sub.add_parser("submit", help="run train (default), eval or synth as a Ray job on a running cluster: "
                        "[COMMAND] CONFIG files then key=value overrides")
    sb.add_argument("items", nargs="*", metavar="COMMAND|FILE|key=value",
                    help="e.g. train cluster-2x8 stage.steps=200, or eval gpu-1xh100 (default command: train)")
    sb.add_argument("--address", help="the head's Jobs API, http://HEAD:8265 (default: job.address, RAY_ADDRESS, "
                    "else this machine's)")
    sb.add_argument("--policy", help="eval: the policy spec, as `cuda-agent eval` takes it (paths on the head node)")
    sb.add_argument("--tasks", nargs="+", help="eval: problem files or folders on the head node (relative: in the package)")
    sb.add_argument("--solutions", metavar="DIR", help="eval: score existing solutions in DIR (on the head node)")
    sb.add_argument("--out", help="eval: output folder (relative: under storage.root)")
    sb.add_argument("--follow", action="store_true", help="print the job's output until it ends")
    sb.set_defaults(func=cmd_submit)

    jobs = sub.add_parser("jobs", help="Ray jobs on a cluster: list, logs, stop").add_subparsers(dest="action", required=True)
    jl = jobs.add_parser("list", help="every job the cluster knows, newest first")
    jl.add_argument("--json", action="store_true")
    jl.set_defaults(func=cmd_jobs_list)
    jg = jobs.add_parser("logs", help="a job's driver output")
    jg.add_argument("job_id")
    jg.add_argument("--follow", action="store_true", help="keep printing until the job ends")
    jg.set_defaults(func=cmd_jobs_logs)
    js = jobs.add_parser("stop", help="stop a job: its driver saves a checkpoint, then exits")
    js.add_argument("job_id")
    js.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds for it to end")
    js.set_defaults(func=cmd_jobs_stop)
    for p in (jl, jg, js):
        p.add_argument("--address", help="the head's Jobs API, http://HEAD:8265 (default: RAY_ADDRESS, else this machine's)")

    doctor = sub.add_parser("doctor", help="versions, GPUs, compilers, and whether a config can run here (exit 1 when "
                            "something it needs is missing): CONFIG files then key=value overrides (default: the defaults)")
    doctor.add_argument("items", nargs="*", metavar="FILE|key=value", help="e.g. cpu-demo, or gpu-1xh100 model.path=/models/q")
    doctor.add_argument("--json", action="store_true")
    doctor.set_defaults(func=cmd_doctor)

    model = sub.add_parser("model", help="the embedded default model").add_subparsers(dest="action", required=True)
    prepare = model.add_parser("prepare", help="convert SmolLM2-135M-Instruct once into a Hugging Face folder")
    prepare.add_argument("--cache-dir", help="default: model.cache_dir from the config")
    prepare.set_defaults(func=cmd_model_prepare)
    return parser


def main(argv: list[str] | None = None) -> int:
    from configs.load import ConfigError
    from launch.embedded_model import ModelPrepareError
    from tasks.task import TaskError

    from actors.storage import StorageError
    from actors.topology import TopologyError
    from launch.jobs import JobError
    from rollout.policy import PolicyError

    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    # `eval CONFIG --policy P key=value`: argparse takes one run of positionals, so CONFIG files and
    # overrides typed after an option arrive here; they are the command's items, not errors.
    if getattr(args, "func", None) in (cmd_eval, cmd_submit) and all(not u.startswith("-") for u in unknown):
        args.items += unknown
    elif getattr(args, "func", None) is cmd_env_eval and all(not u.startswith("-") for u in unknown):
        args.overrides += unknown  # folders or overrides typed after an option: sorted out by their "="
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.func(args)
    except (ConfigError, TaskError, ModelPrepareError, PolicyError, TopologyError, StorageError, JobError) as err:
        err_console.print(f"[red]error:[/red] {err}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
