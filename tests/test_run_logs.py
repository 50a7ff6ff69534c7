"""actors/run_logs.py: the Ray workers' output goes to the run folder, not the driver's terminal; a
failed run's driver quotes the last traceback found there; our loggers take logging.level."""
from __future__ import annotations

import logging
import os
import sys
import time

import pytest
import ray

from actors.run_logs import (DRIVER_LOG, LOG_DIR_ENV, actor_creation_output, failure_report, ray_init_options,
                             set_log_level)
from actors.topology import start_cluster
from configs.load import ConfigError
from configs.schema import ActorLogs, ClusterConfig, LoggingConfig

MARK = "cuda-agent-run-logs-test"


def test_a_workers_output_and_its_childrens_land_in_the_run_folder_not_on_the_drivers_terminal(tmp_path, capfd):
    assert not ray.is_initialized()

    @ray.remote
    class Talker:
        def talk(self) -> tuple[int, dict[str, str | None]]:
            import os
            import subprocess
            import sys
            import traceback

            print(f"{MARK} on stdout")
            print(f"{MARK} on stderr", file=sys.stderr)
            # A process the actor starts writes where the actor does: vLLM's engine core is one.
            subprocess.run([sys.executable, "-c", f"print('{MARK} from a child process')"], check=True)
            logging.getLogger("cuda_agent.test").info(f"{MARK} from our logger")
            try:
                raise RuntimeError(f"{MARK}: an engine died")
            except RuntimeError:
                traceback.print_exc()
            sys.stdout.flush()
            quiet = ("VLLM_LOGGING_LEVEL", "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS")
            return os.getpid(), {k: os.environ.get(k) for k in quiet}

    start_cluster(ClusterConfig(num_cpus=1), ray_init_options(LoggingConfig(), tmp_path))
    try:
        pid, env = ray.get(Talker.remote().talk.remote(), timeout=300)
    finally:
        ray.shutdown()
    out, err = capfd.readouterr()
    assert MARK not in out and MARK not in err, "a worker's output reached the driver's terminal"
    log = (tmp_path / "logs" / f"worker-{pid}.log").read_text()
    for line in ("on stdout", "on stderr", "from a child process", "from our logger", "an engine died"):
        assert f"{MARK} {line}" in log or f"{MARK}: {line}" in log, f"{line!r} missing from the worker's file:\n{log}"
    assert env == {"VLLM_LOGGING_LEVEL": "WARNING", "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    report = failure_report(tmp_path)
    assert str(tmp_path / "logs") in report and f"worker-{pid}.log (Talker)" in report, report
    assert "Traceback (most recent call last):" in report and f"RuntimeError: {MARK}: an engine died" in report, report


def test_console_keeps_rays_default_and_the_shells_own_settings_win(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")  # the user debugging the engine
    options = ray_init_options(LoggingConfig(actor_logs=ActorLogs.console, level="debug"), tmp_path)
    env = options["runtime_env"]["env_vars"]
    assert "log_to_driver" not in options and LOG_DIR_ENV not in env and not (tmp_path / "logs").exists()
    assert "VLLM_LOGGING_LEVEL" not in env and env["TRANSFORMERS_VERBOSITY"] == "error"
    assert env["CUDA_AGENT_LOG_LEVEL"] == "DEBUG"
    assert failure_report(tmp_path) == ""  # nothing to point at


def test_a_failure_report_skips_an_earlier_runs_files(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    old = logs / "worker-1.log"
    old.write_text(":actor_name:GeneratorActor\nTraceback (most recent call last):\nValueError: last week's\n")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    assert "last week's" in failure_report(tmp_path)
    assert failure_report(tmp_path, since=time.time() - 60) == ""


def test_logging_level_sets_our_loggers_and_refuses_a_name_logging_does_not_know():
    set_log_level("warning")
    assert logging.getLogger("cuda_agent.train").getEffectiveLevel() == logging.WARNING
    set_log_level("INFO")
    assert logging.getLogger("cuda_agent.train").getEffectiveLevel() == logging.INFO
    assert len(logging.getLogger("cuda_agent").handlers) == 1  # set twice, one handler
    with pytest.raises(ConfigError, match="logging.level 'loud'.*DEBUG, INFO, WARNING, ERROR, CRITICAL"):
        set_log_level("loud")


def test_the_drivers_terminal_gets_neither_rays_token_notice_nor_its_error_about_restartable_actors(tmp_path, capfd):
    # Both printed on every training run's terminal: Ray's "Token authentication is enabled..." (a
    # private cluster's default) and, at error level from core_worker.cc, "has constructor arguments
    # in the object store and max_restarts > 0" for a generator given the env workers' and the
    # buffer's handles, which the driver holds for the generator's life: nothing to act on either.
    from actors.generator import GeneratorActor

    @ray.remote(num_cpus=0)
    class Stand:  # an env worker's or the buffer's place: a generator only keeps their handles until it runs
        def ping(self) -> int:
            return 1

    assert not ray.is_initialized()
    start_cluster(ClusterConfig(num_cpus=1), ray_init_options(LoggingConfig(), tmp_path))
    try:
        workers, buffer = [Stand.remote(), Stand.remote()], Stand.remote()
        with actor_creation_output(LoggingConfig(), tmp_path):
            generator = GeneratorActor.options(max_restarts=-1, num_cpus=0).remote({}, workers, buffer, 0, "vllm:/nowhere")
        print("the driver's own stderr is back", file=sys.stderr)
        assert ray.get(generator.get_stats.remote(), timeout=300)["version"] == -1  # built; its engine starts on first use
    finally:
        ray.shutdown()
    _, err = capfd.readouterr()
    assert "Token authentication" not in err, err
    assert "constructor arguments in the object store" not in err and "the driver's own stderr is back" in err, err
    assert "constructor arguments in the object store" in (tmp_path / "logs" / DRIVER_LOG).read_text()
