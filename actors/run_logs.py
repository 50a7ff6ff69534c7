"""Where a run's messages go: our loggers' level, and the Ray workers' own output.

Our loggers (``cuda_agent.*``) write to stderr at ``logging.level``, in the driver and in every
Ray worker. The workers' own stdout and stderr (vLLM's engine, transformers' weight loading,
tracebacks) used to fill the driver's terminal around the progress display: some 300 lines
for the CPU demo. With ``logging.actor_logs: file`` each worker process of the run, and every
process it starts (vLLM's engine core), writes them to ``<run>/logs/worker-<pid>.log``
instead: Ray's ``worker_process_setup_hook`` (``setup_worker`` below) points file descriptors
1 and 2 there before any actor code runs, and Ray's copy to the driver is off
(``log_to_driver=False``). Ray itself writes each actor's class into its file
(``:actor_name:``); when a run fails, the driver quotes the last traceback it finds there
(``failure_report``). A node that does not see the run folder keeps its workers' output in
Ray's session logs on that node. ``console`` is Ray's default: everything on the terminal.

Either way the libraries are turned down inside the workers (vLLM to WARNING, no progress
bars), except where the driver's environment sets those variables itself. This module runs
in every worker at its start: the standard library only at import.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterator

LOGGER = "cuda_agent"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_DIR_ENV = "CUDA_AGENT_WORKER_LOGS"  # the folder a worker writes its output to ("" or unset: Ray's default)
LEVEL_ENV = "CUDA_AGENT_LOG_LEVEL"
QUIET = {"VLLM_LOGGING_LEVEL": "WARNING", "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
HOOK = f"{__name__}.setup_worker"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
TRACEBACK = "Traceback (most recent call last):"
ACTOR_MARK = ":actor_name:"  # Ray's line naming the actor a worker process hosts
TAIL_BYTES = 256 * 1024  # a failure report reads this much of each file's end
REPORT_LINES = 40


def worker_log_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir).expanduser().resolve() / "logs"


class _Stderr(logging.Handler):
    """Writes to whatever sys.stderr is when a record comes: rich's live display swaps it to print above itself."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def checked_level(level: str) -> str:
    """``level`` as logging's name for it; a ConfigError for anything else."""
    name = str(level).upper()
    if name not in LEVELS:
        from configs.load import ConfigError  # not at import: workers import this module at their start

        raise ConfigError(f"logging.level {level!r} is not a logging level: use one of {', '.join(LEVELS)}")
    return name


def set_log_level(level: str) -> None:
    """Our loggers (cuda_agent.*) at ``level``, written to stderr."""
    name = checked_level(level)
    logger = logging.getLogger(LOGGER)
    logger.setLevel(name)
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)


def quiet_libraries() -> None:
    """Turn vLLM and transformers down in this process, as in the workers; what the shell sets wins."""
    os.environ.update({key: value for key, value in QUIET.items() if key not in os.environ})


def ray_init_options(logging_cfg: Any, run_dir: str | os.PathLike) -> dict[str, Any]:
    """ray.init's arguments for a run writing to ``run_dir``: the workers' environment and where their output goes."""
    mode = str(logging_cfg.actor_logs)
    level = checked_level(logging_cfg.level)
    # A variable the driver's environment sets is the user's choice (VLLM_LOGGING_LEVEL=DEBUG to debug
    # the engine); in a Ray job it is the job's, and naming it again here would conflict with it.
    env = {key: value for key, value in QUIET.items() if key not in os.environ}
    env[LEVEL_ENV] = level
    # Ray runs the hook before it puts the driver's folders on a worker's path: the workers must
    # import this checkout (the driver's), not another one installed in the same environment. A
    # PYTHONPATH of the driver's own (a Ray job's working_dir sets one) reaches local workers as it is,
    # and naming it again here would conflict with a job's.
    if "PYTHONPATH" not in os.environ:
        env["PYTHONPATH"] = str(PACKAGE_ROOT)
    options: dict[str, Any] = {"runtime_env": {"env_vars": env, "worker_process_setup_hook": HOOK}}
    if mode == "file":
        logs = worker_log_dir(run_dir)
        logs.mkdir(parents=True, exist_ok=True)
        env[LOG_DIR_ENV] = str(logs)
        options["log_to_driver"] = False
    return options


DRIVER_LOG = "driver.log"


@contextlib.contextmanager
def actor_creation_output(logging_cfg: Any, run_dir: str | os.PathLike) -> Iterator[None]:
    """While the driver creates actors, its own stderr (file descriptor 2) goes to RUN/logs/driver.log
    (with logging.actor_logs=file; console keeps it on the terminal).

    Ray's core worker writes an error-level line to the driver's stderr when an actor that Ray may
    restart (max_restarts) gets actor handles among its constructor's arguments: "has constructor
    arguments in the object store and max_restarts > 0 ... the actor restart will fail"
    (ray-project/ray#53727). Our generators get the env workers and the buffer so, and the driver
    holds those handles for the generators' whole life, so a restart finds them (tests/test_train.py
    kills and restarts one): nothing for a user to act on, and no line for the terminal. Creating an
    actor is quick and comes before the progress display starts, so nothing else is caught."""
    if str(logging_cfg.actor_logs) != "file":
        yield
        return
    logs = worker_log_dir(run_dir)
    logs.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        redirect = os.open(logs / DRIVER_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(redirect, 2)
        os.close(redirect)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def output_to_log(path: Path) -> Iterator[Any]:
    """This process's file descriptors 1 and 2 (and so its children's, and every library's prints and
    warnings) appended to ``path`` while the block runs; yields a text stream to the terminal
    (the original stdout) for what is meant for a person. For a command that runs an engine in
    its own process (`cuda-agent episode`), as the workers' output goes to their files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    try:
        redirect_output(path)
        yield terminal
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        terminal.close()
        for fd, original in zip((1, 2), saved):
            os.dup2(original, fd)
            os.close(original)


def setup_worker() -> None:
    """Ray's worker_process_setup_hook: this worker's output to the run's log folder, our loggers' level.

    Never raises: Ray ends a worker whose hook fails, and a worker that cannot follow the
    setting (a node without the run folder) is better kept with Ray's defaults."""
    try:
        folder = os.environ.get(LOG_DIR_ENV, "")
        if folder and os.path.isdir(folder):
            redirect_output(Path(folder) / f"worker-{os.getpid()}.log")
        set_log_level(os.environ.get(LEVEL_ENV, "INFO"))
    except Exception as err:  # noqa: BLE001 - see the docstring
        print(f"cuda-agent: this worker keeps Ray's log settings: {type(err).__name__}: {err}", file=sys.stderr)


def redirect_output(path: Path) -> None:
    """File descriptors 1 and 2 of this process, and of every process it starts from now on, appended to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def failure_report(run_dir: str | os.PathLike, since: float = 0.0) -> str:
    """For a run that failed: where its workers' output is, and the last traceback there ("" without files).

    ``since``: the run's start (time.time()); files last written before it are an earlier run's."""
    logs = worker_log_dir(run_dir)
    found = [(f.stat().st_mtime, f) for f in logs.glob("worker-*.log")] if logs.is_dir() else []
    files = [f for mtime, f in sorted(found) if mtime >= since]
    if not files:
        return ""
    for path in reversed(files):
        text = _tail(path)
        at = text.rfind(TRACEBACK)
        if at >= 0:
            shown = text[at:].splitlines()[-REPORT_LINES:]
            return (f"the Ray workers' output is in {logs} (a file per worker process); the last traceback there, "
                    f"in {path.name} ({_actor(path)}):\n" + "\n".join(shown))
    return f"the Ray workers' output is in {logs} (a file per worker process); no traceback in it"


def _tail(path: Path) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - TAIL_BYTES))
        return f.read().decode(errors="replace")


def _actor(path: Path) -> str:
    """The actor class Ray wrote into a worker's file (its first bytes), or "a Ray worker"."""
    with open(path, "rb") as f:
        head = f.read(TAIL_BYTES).decode(errors="replace")
    names = [line.split(ACTOR_MARK, 1)[1].strip() for line in head.splitlines() if ACTOR_MARK in line]
    return names[-1] if names else "a Ray worker"
