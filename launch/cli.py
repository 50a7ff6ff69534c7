"""`cuda-agent`: the command line. Each subcommand is a thin call into the package that owns the work."""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

console = Console(soft_wrap=True)  # a line with a path stays one line (a path broken in two cannot be pasted)
err_console = Console(stderr=True, soft_wrap=True)  # errors stay on one line for grep and logs


def _split_files_and_overrides(items: list[str]) -> tuple[list[str], list[str]]:
    files = [i for i in items if "=" not in i]
    return files, [i for i in items if "=" in i]


def _config_items(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(config files, key=value overrides) of a command: its FILE|key=value items, the files
    given with --config first (the older spelling of the same thing). On `env eval`, whose items
    are solution folders too, a config file is a .yaml or a shipped config's name."""
    files, overrides = _split_files_and_overrides(args.items)
    if args.func is cmd_env_eval:
        files = [f for f in files if _is_config_file(f)]
    return list(args.config or []) + files, overrides


def _solution_folders(args: argparse.Namespace) -> list[str]:
    """`env eval`'s items that are neither config files nor overrides."""
    return [i for i in args.items if "=" not in i and not _is_config_file(i)]


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

    if str(cfg.logging.actor_logs) == "file":
        report = failure_report(run_dir, since)
        if report:
            err_console.print(report, markup=False, highlight=False)


def cmd_config_show(args: argparse.Namespace) -> int:
    from configs.document import render
    from configs.load import load_config

    files, overrides = _config_items(args)
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

    tasks, failures = load_tasks(_existing(args.paths))
    rows = []
    for task in tasks:
        shape = describe_task(task, args.backend)
        rows.append({"id": task.id, "level": task.level, "entry": asdict(task.entry), "dtype": shape.dtype,
                     "inputs": shape.inputs, "init_inputs": shape.init_inputs, "path": task.path})
    if args.json:
        print(json.dumps({"tasks": rows, "failures": [asdict(f) for f in failures]}, indent=2))
        return 1 if failures else 0
    if rows:  # an empty table would say nothing the failures below do not
        table = Table(title=f"{len(tasks)} tasks ({args.backend} shapes)")
        for col in ("id", "level", "entry points", "inputs", "init inputs"):
            table.add_column(col)
        for row in rows:
            e = row["entry"]
            table.add_row(row["id"], str(row["level"] or "-"), f"{e['model']}, {e['inputs']}, {e['init_inputs']}",
                          "\n".join(row["inputs"]), ", ".join(row["init_inputs"]) or "-")
        console.print(table)
    _print_load_failures(failures, "failed")
    return 1 if failures else 0


def _existing(paths: list[str]) -> list[str]:
    """The problem paths given, all of which must exist: a misspelt one is an error, not an empty table."""
    from tasks.task import TaskError

    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise TaskError(f"no such file or folder: {', '.join(missing)}; give problem files or folders (with none, the "
                        "starter set)")
    return paths


def _print_load_failures(failures: list, what: str) -> None:
    from rich.text import Text

    for failure in failures:  # a reason may hold brackets: not markup
        console.print(Text.assemble((what, "red"), f" {failure.path}: {failure.reason}"))


def cmd_tasks_check(args: argparse.Namespace) -> int:
    import torch
    from rich.progress import track
    from rich.table import Table

    from tasks.loader import load_tasks
    from tasks.screen import screen_task

    if args.threads:
        torch.set_num_threads(args.threads)
    tasks, failures = load_tasks(_existing(args.paths))
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
        _print_load_failures(failures, "failed to load")
    return 0 if all(r.ok for r in results) and not failures else 1


def cmd_doctor(args: argparse.Namespace) -> int:
    from configs.load import load_config
    from launch.doctor import diagnose, print_report

    files, overrides = _config_items(args)
    named = " ".join(files) or "the default config"
    report = diagnose(load_config(files, overrides), named + (f" (with {len(overrides)} override(s))" if overrides else ""))
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

    from env_pool.pool import EnvPool
    from launch.report import print_eval_result
    from tasks.solution import read_solution
    from tasks.task import TaskError

    # Folders, config files and key=value overrides in any order (after --json too): an override
    # has a "=", a config file is a .yaml or a shipped config's name, anything else is a folder.
    files, overrides = _config_items(args)
    folders = _solution_folders(args)
    if not folders:
        raise TaskError("no solution folder given: name one or more folders holding model_new.py after the task "
                        "(e.g. cuda-agent env eval level1/01_gelu tests/env_corpus/legit/gelu_omp)")
    cfg = _run_config(files, overrides)
    task = _find_task(args.task, args.tasks)
    solutions = []
    for name in folders:
        folder = Path(name)
        if not folder.is_dir():
            raise TaskError(f"solution folder {name!r} does not exist (or is not a folder): give the folder that "
                            "holds model_new.py")
        solutions.append((name, read_solution(folder)))
    pool = EnvPool(cfg.env)
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


def _is_config_file(name: str) -> bool:
    """A config file (a .yaml path) or a shipped config's name, as opposed to a solution folder."""
    from configs.load import packaged_config_dir

    if Path(name).is_dir():
        return False
    return name.endswith((".yaml", ".yml")) or (packaged_config_dir() / f"{name}.yaml").is_file()


def _end_with_the_command(pool) -> None:
    """Ctrl-C, SIGTERM or a closed terminal end the command now, and what it started with it.

    Python's own KeyboardInterrupt would first wait for the evaluation's threads (a load_inline
    build runs minutes in one); exiting from the handler instead kills those threads, and with
    them the sandboxed runs they started (each shim dies with its thread), and the harness is
    killed here (it would also end by itself once its stdin closes). The precompiled header's
    job alone goes on: it is the machine's, not this command's (env_pool/build/inline_pch.py).
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
    import contextlib
    import os

    from actors.run_logs import output_to_log, quiet_libraries, worker_log_dir

    files, overrides = _config_items(args)
    overrides += [f"env.backend={args.backend}"] if args.backend else []
    overrides += [f"rollout.max_turns={args.max_turns}"] if args.max_turns else []
    cfg = _run_config(files, overrides)
    task = _find_task(args.task, args.tasks)
    # The engine runs in this process here, not in an actor: quieted as the actors are, before
    # vLLM and transformers are imported (they read their levels then), and what they print
    # anyway (Triton, NUMA, FutureWarnings, the engine core's start-up) goes to the run's logs/.
    to_file = str(cfg.logging.actor_logs) == "file"
    log_file = worker_log_dir(cfg.logging.out_dir) / f"episode-{os.getpid()}.log"
    if to_file:
        quiet_libraries()
    from rich.console import Console
    from rich.markup import escape

    from launch.report import episode_line, print_transcript
    from launch.single_episode import run_single_episode

    err_console.print(f"one episode of {args.policy} on {task.id}, up to {cfg.rollout.max_turns} turn(s): starting "
                      "the policy and the environment" + (f" (their output: {log_file})" if to_file else ""))
    try:
        with output_to_log(log_file) if to_file else contextlib.nullcontext(sys.stderr) as terminal:
            shown = Console(file=terminal, stderr=True) if to_file else err_console
            traj, out = asyncio.run(run_single_episode(cfg, task, args.policy, args.out, progress=not args.quiet,
                                                       console=shown))
    except Exception:
        if to_file:
            err_console.print(f"the episode failed; the libraries' output is in {log_file}")
        raise
    if args.transcript:
        path = Path(args.transcript)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            print_transcript(traj, Console(file=f, width=100, color_system=None))
        console.print(episode_line(traj) + f"; transcript: {escape(str(path))}", highlight=False, soft_wrap=True)
    else:
        print_transcript(traj, console)
    console.print(f"trajectory saved to {out}")
    return 0 if traj.stop_reason != "error" else 1


def cmd_train(args: argparse.Namespace) -> int:
    from configs.schema import EnvKind
    from launch.report import print_training_summary
    from launch.train import train

    cfg = _run_config(*_config_items(args))
    if args.report_only:  # a run's summary again, without starting anything
        out = Path(cfg.logging.out_dir)
        if not (out / "metrics.jsonl").exists():
            from configs.load import ConfigError

            raise ConfigError(f"no training run in {out} (no metrics.jsonl): give the config (and logging.out_dir) "
                              "the run was started with")
        print_training_summary(out, console, str(cfg.env.kind))
        return 0
    started = time.time()
    try:
        out = train(cfg)
    except KeyboardInterrupt:
        err_console.print(f"interrupted: a checkpoint was saved in {cfg.logging.out_dir}; run the same command to resume")
        return 130
    except Exception:
        _point_at_worker_output(cfg, cfg.logging.out_dir, started)
        raise
    console.print(f"done in {(time.time() - started) / 60:.1f} min: metrics, plots and checkpoints in {out}")
    if not args.no_summary:
        print_training_summary(out, console, str(cfg.env.kind))
        if cfg.env.kind == EnvKind.verifier:
            _print_preference_change(cfg, out)
    return 0


def _print_preference_change(cfg, out: Path) -> None:
    """The learning check's noise-free verdict: the model trained from against the policy exported
    (launch/primed_model.answer_preference; README: the learning check)."""
    from launch.embedded_model import resolve_model_path
    from launch.primed_model import answer_preference, preference_change

    policy = out / cfg.stage.name / "export" / "policy"
    if not policy.is_dir():
        return
    with console.status("scoring the asked word under the starting model and the trained policy"):
        before = answer_preference(resolve_model_path(cfg.model.path, cfg.model.cache_dir))
        after = answer_preference(policy)
    console.print(preference_change(before, after, bool(cfg.env.verifier.inverted)))


def cmd_synth(args: argparse.Namespace) -> int:
    from launch.synth import run_synth

    cfg = _run_config(*_config_items(args))
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

    cfg = _run_config(*_config_items(args))
    if args.solutions and args.policy:
        raise TaskError("give --policy (run agents) or --solutions (score existing kernels), not both")
    from configs.load import under_root

    sweep = build_sweep(cfg, args.policy, args.tasks, args.out and under_root(cfg, args.out), args.solutions)
    if not (args.policy or args.solutions or args.report_only) and not _names_eval_policy(*_config_items(args)):
        _refuse_an_unasked_cpu_sweep(cfg, sweep)
    if args.report_only:  # a stopped sweep's report, for the problems it finished
        if not write_report_of(sweep):
            raise TaskError(f"no finished episodes of these problems in {sweep.out}/results.jsonl: nothing to report")
        return _print_eval_summary(sweep.out, sweep.policy)
    turns = "" if args.solutions else f", up to {cfg.eval.max_turns} turns each"
    console.print(f"evaluating {len(sweep.tasks)} problem(s) x {sweep.samples} sample(s) with {sweep.policy}{turns}; "
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


def _names_eval_policy(files: list[str], overrides: list[str]) -> bool:
    """Whether the command line or one of its config files sets eval.policy (not the schema's default)."""
    from omegaconf import OmegaConf

    from configs.load import resolve_config_path

    if any(o.split("=", 1)[0] == "eval.policy" for o in overrides):
        return True
    return any(OmegaConf.select(OmegaConf.load(resolve_config_path(f)), "eval.policy") is not None for f in files)


def _refuse_an_unasked_cpu_sweep(cfg, sweep) -> None:
    """`cuda-agent eval` with no --policy, --solutions or eval.policy runs the default policy on every
    problem: with vLLM on the CPU that is hours of work, which nobody should start by leaving out a flag."""
    from tasks.task import TaskError

    kind = sweep.policy.partition(":")[0]
    if kind != "vllm" or int(cfg.cluster.generator_gpus) > 0:
        return
    raise TaskError(
        f"no --policy or --solutions given: this would run {sweep.policy} (eval.policy) with vLLM on the CPU on "
        f"{len(sweep.tasks)} problem(s) x {sweep.samples} sample(s), up to {cfg.eval.max_turns} turns each: minutes per "
        f"episode, hours in all. Give --policy {sweep.policy} to run it anyway (--tasks and eval.max_turns=N make it "
        "smaller), or --solutions DIR to score existing kernels")


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
    items = list(args.config or []) + items
    job_id, run_dir = submit(command, items, args.address, args.policy, args.tasks, args.solutions, args.out)
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


CONFIG_ITEMS = "FILE|key=value"
CONFIG_HELP = ("config files (a path, or a shipped config's name, listed below), then key=value overrides; "
               "`cuda-agent config show` prints the result")
CONFIG_OPTION_HELP = "a config file, as a FILE item gives it (repeatable; kept for older command lines)"
TASKS_HELP = "problem files or folders, one or several after the flag (default: {default})"
STAGES_HELP = """stages (stage.name=..., default recipe: all four in this order):
  single_turn_ppo   PPO warm-up on single-turn episodes (stage.single_turn_max_turns)
  rft               rejection fine-tuning on the episodes that pass learner.rft's filter
  value_pretrain    the critic trained on the policy's episodes, the policy fixed
  agentic_ppo       multi-turn agentic PPO with the critic (rollout.max_turns)
"""
FIRST_COMMANDS = """first commands:
  cuda-agent doctor cpu-demo       what this machine has, and whether the CPU demo can run here
  cuda-agent train cpu-demo        the whole recipe on the CPU (what `make demo` runs; ~11 min on 2 cores)
  cuda-agent tasks list            the starter problems
  cuda-agent env eval level1/01_gelu tests/env_corpus/legit/gelu_omp   score one kernel
Each command's --help says more; README.md has the rest."""


def _shipped_lines() -> str:
    from configs.load import shipped_configs

    return "shipped configs (give several to stack them, later ones win):\n" + "\n".join(
        f"  {name:<14}{about}" for name, about in shipped_configs().items())


def _add_config_items(p: argparse.ArgumentParser, example: str, about: str = CONFIG_HELP) -> None:
    p.add_argument("items", nargs="*", metavar=CONFIG_ITEMS, help=f"{about}; {example}")
    p.add_argument("--config", action="append", metavar="FILE", help=CONFIG_OPTION_HELP)


def _add_tasks(p: argparse.ArgumentParser, default: str) -> None:
    # Several values after one flag, and the flag repeated: both read the same (extend).
    p.add_argument("--tasks", nargs="+", action="extend", metavar="PATH", help=TASKS_HELP.format(default=default))


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="cuda-agent", description="Train and evaluate LLM agents that write fast kernels.",
                                     formatter_class=raw, epilog=FIRST_COMMANDS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    config = sub.add_parser("config", help="inspect configs").add_subparsers(dest="action", required=True)
    show = config.add_parser("show", help="print the resolved config, every key with its comment",
                             formatter_class=raw, epilog=_shipped_lines())
    _add_config_items(show, "with none, the defaults", about=CONFIG_HELP.split(";")[0])
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
                        formatter_class=raw, epilog=(
                            "Each command starts the environment cold (its harness, servers and the task's baselines: "
                            "~17 s on 2 CPUs,\nagainst ~1.6 s warm): give several folders to one command, or score many "
                            "problems with\n`cuda-agent eval --solutions DIR`, to keep it warm. Nothing the command starts "
                            "outlives it, but\nthe precompiled torch/extension.h for load_inline builds: built once per "
                            "machine by a job of its\nown (env.pch_dir; its log beside it)."))
    ev.add_argument("task", help="task id, e.g. level1/03_softmax (see `cuda-agent tasks list`), or a problem file")
    ev.add_argument("items", nargs="*", metavar="FOLDER|FILE|key=value",
                    help="folder(s) with model_new.py and its kernel sources, evaluated in turn by one environment; "
                         "config files (a .yaml, or a shipped config's name) and key=value overrides, e.g. env.backend=cuda")
    ev.add_argument("--config", action="append", metavar="FILE", help=CONFIG_OPTION_HELP)
    _add_tasks(ev, "the starter set")
    ev.add_argument("--mode", choices=["compile", "verify", "full"], default="full",
                    help="compile: build only; verify: build and check the outputs on the verification sets; full "
                         "(default): also time against eager and torch.compile, as a training episode's reward does")
    ev.add_argument("--json", action="store_true", help="print each result as JSON (a list for several folders)")
    ev.set_defaults(func=cmd_env_eval)

    ep = sub.add_parser("episode", help="run one agent episode on a task and print its transcript",
                        formatter_class=raw, epilog=_shipped_lines())
    ep.add_argument("task", help="task id, e.g. level1/01_gelu (see `cuda-agent tasks list`), or a problem file")
    _add_config_items(ep, "e.g. cpu-demo rollout.temperature=0.7")
    ep.add_argument("--policy", default="vllm:embedded", help="vllm:MODEL_DIR (embedded: SmolLM2), openai:URL[#model], or replay:FILE")
    ep.add_argument("--backend", choices=["cpp", "cuda"], help="kernel backend (default: env.backend)")
    ep.add_argument("--max-turns", type=int, help="turn budget (default: rollout.max_turns)")
    ep.add_argument("--out", help="where to save the trajectory (msgpack); default: logging.out_dir/episodes/")
    ep.add_argument("--transcript", metavar="FILE",
                    help="write the transcript to FILE and print only the episode's one-line result")
    _add_tasks(ep, "the starter set")
    ep.add_argument("--quiet", action="store_true", help="no live status line")
    ep.set_defaults(func=cmd_episode)

    evp = sub.add_parser("eval", help="an evaluation sweep (agents, or existing kernels) and its report",
                         formatter_class=raw, epilog=(
                             "--solutions DIR reads, per problem: DIR/TASK_ID/ or DIR/NAME/ holding model_new.py (and its "
                             "kernel sources), DIR/TASK_ID.py or DIR/NAME.py defining ModelNew, or KernelBench's "
                             "level_L_problem_P_sample_S_kernel.py.\nRerunning the same command continues a stopped sweep. "
                             "Without a GPU, running a policy (up to eval.max_turns turns per episode) takes\nminutes per "
                             "episode: give --policy to mean it.\n\n" + _shipped_lines()))
    _add_config_items(evp, "e.g. cpu-demo eval.samples_per_task=4")
    evp.add_argument("--policy", help="vllm:MODEL_DIR, vllm:embedded, openai:URL#MODEL or replay:FILE|DIR (default: eval.policy)")
    _add_tasks(evp, "eval.tasks, else the starter set")
    evp.add_argument("--solutions", metavar="DIR", help="score existing solutions in DIR instead of running a policy")
    evp.add_argument("--out", help="output folder (default: eval.out_dir)")
    evp.add_argument("--quiet", action="store_true", help="no live progress display")
    evp.add_argument("--report-only", action="store_true", help="run nothing: write the report of the episodes "
                     "already finished in the output folder (a stopped sweep's)")
    evp.set_defaults(func=cmd_eval)

    tr = sub.add_parser("train", help="run a training stage or the whole recipe", formatter_class=raw,
                        epilog=STAGES_HELP + "\n" + _shipped_lines() + "\n\nA rerun of the same command resumes; "
                        "results go to logging.out_dir (metrics.jsonl, plots, exports, logs/).")
    _add_config_items(tr, "e.g. cpu-demo stage.name=agentic_ppo stage.steps=20")
    tr.add_argument("--no-summary", action="store_true", help="end without the summary table (--report-only prints it "
                    "later: make demo shows an episode of the trained policy first)")
    tr.add_argument("--report-only", action="store_true", help="run nothing: print the summary of the run in "
                    "logging.out_dir (its stages, plots and policy)")
    tr.set_defaults(func=cmd_train)

    sy = sub.add_parser("synth", help="build a training task set (crawl, compose, filter, dedup, screen)",
                        formatter_class=raw, epilog=_shipped_lines())
    _add_config_items(sy, "e.g. synth.tasks=300 synth.out_dir=runs/synth")
    sy.set_defaults(func=cmd_synth)

    sb = sub.add_parser("submit", help="run train (default), eval or synth as a Ray job on a running cluster: "
                        "[COMMAND] CONFIG files then key=value overrides")
    sb.add_argument("items", nargs="*", metavar="COMMAND|FILE|key=value",
                    help="e.g. train cluster-2x8 stage.steps=200, or eval gpu-1xh100 (default command: train)")
    sb.add_argument("--config", action="append", metavar="FILE", help=CONFIG_OPTION_HELP)
    sb.add_argument("--address", help="the head's Jobs API, http://HEAD:8265 (default: job.address, RAY_ADDRESS, "
                    "else this machine's)")
    sb.add_argument("--policy", help="eval: the policy spec, as `cuda-agent eval` takes it (paths on the head node)")
    _add_tasks(sb, "eval: eval.tasks; paths on the head node, relative ones in the package")
    sb.add_argument("--solutions", metavar="DIR", help="eval: score existing solutions in DIR (on the head node)")
    sb.add_argument("--out", help="eval: output folder (relative: under storage.root)")
    sb.add_argument("--follow", action="store_true", help="print the job's output until it ends")
    sb.set_defaults(func=cmd_submit)

    jobs = sub.add_parser("jobs", help="Ray jobs on a cluster: list, logs, stop").add_subparsers(dest="action", required=True)
    jl = jobs.add_parser("list", help="every job the cluster knows, newest first")
    jl.add_argument("--json", action="store_true", help="machine-readable output")
    jl.set_defaults(func=cmd_jobs_list)
    jg = jobs.add_parser("logs", help="a job's driver output")
    jg.add_argument("job_id", help="the job's id, as `cuda-agent submit` printed it or `cuda-agent jobs list` shows it")
    jg.add_argument("--follow", action="store_true", help="keep printing until the job ends")
    jg.set_defaults(func=cmd_jobs_logs)
    js = jobs.add_parser("stop", help="stop a job: its driver saves a checkpoint, then exits")
    js.add_argument("job_id", help="the job's id, as `cuda-agent jobs list` shows it")
    js.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds for it to end")
    js.set_defaults(func=cmd_jobs_stop)
    for p in (jl, jg, js):
        p.add_argument("--address", help="the head's Jobs API, http://HEAD:8265 (default: RAY_ADDRESS, else this machine's)")

    doctor = sub.add_parser("doctor", help="versions, GPUs, compilers, and whether a config can run here (exit 1 "
                            "naming the fix when something it needs is missing)", formatter_class=raw,
                            epilog=_shipped_lines())
    _add_config_items(doctor, "e.g. cpu-demo, or gpu-1xh100 model.path=/models/q (with none, the defaults)")
    doctor.add_argument("--json", action="store_true", help="the report as JSON: packages, tools, GPUs, backends and "
                        "each need with its fix")
    doctor.set_defaults(func=cmd_doctor)

    model = sub.add_parser("model", help="the embedded default model").add_subparsers(dest="action", required=True)
    prepare = model.add_parser("prepare", help="convert SmolLM2-135M-Instruct once into a Hugging Face folder")
    prepare.add_argument("--cache-dir", help="default: model.cache_dir from the config")
    prepare.set_defaults(func=cmd_model_prepare)
    return parser


def sort_out_items(args: argparse.Namespace, unknown: list[str]) -> list[str]:
    """Positional items typed after an option, and overrides caught by --tasks, back where they belong;
    returns what is left unrecognised.

    argparse takes one run of positionals, so `eval cpu-demo --policy P key=value` hands
    `key=value` back as unknown: it is one of the command's items. `--tasks` takes several
    values, so a key=value typed after it (not a path) lands there, and on `env eval` a
    solution folder (one holding model_new.py) too."""
    if not hasattr(args, "items"):
        return unknown
    args.items += [u for u in unknown if not u.startswith("-")]
    left = [u for u in unknown if u.startswith("-")]
    if getattr(args, "tasks", None):
        back = [t for t in args.tasks if "=" in t and not Path(t).exists()]
        if args.func is cmd_env_eval:
            back += [t for t in args.tasks if (Path(t) / "model_new.py").is_file()]
        args.tasks = [t for t in args.tasks if t not in back] or None
        args.items += back
    return left


def interruptible() -> None:
    """Ctrl-C and `cuda-agent jobs stop` (SIGINT) stop every command, however it was started.

    A shell without job control (a script's `cuda-agent synth ... &`, `nohup ... &`) starts its
    background commands with SIGINT ignored, and Python keeps an inherited SIG_IGN: such a run
    went on to its end through a stop, its report never marked unfinished (tests/test_synth.py).
    """
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
    unknown = sort_out_items(args, unknown)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    interruptible()
    try:
        return args.func(args)
    except (ConfigError, TaskError, ModelPrepareError, PolicyError, TopologyError, StorageError, JobError) as err:
        from rich.text import Text

        # Not markup: a message may quote brackets ("[cpp, cuda]", "[kind]"), which rich would eat.
        err_console.print(Text.assemble(("error:", "red"), f" {err}"))
        return 2


if __name__ == "__main__":
    sys.exit(main())
