"""Training metrics: one record per step to JSONL and TensorBoard, and reading them back.

A record is a flat mapping of ``group/name`` to a number (nested dicts are flattened with "/"),
keyed by a global step that keeps counting across the stages of the recipe. The names below
are the ones the plots (launch/plots.py), the live progress (launch/progress.py) and the run
report read; the driver may log any others.

Resuming: a run restarted from the checkpoint of step N opens the sink with ``resume_step=N``.
Records after N came from weights that were lost, so they are removed from metrics.jsonl and
TensorBoard is told to purge them (``purge_step``); the rerun writes those steps afresh, once.
Without ``resume_step`` the sink continues after the last step on disk and skips any step
already there.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Mapping

from protocol.records import cut_torn_line, read_records

log = logging.getLogger("cuda_agent.metrics")

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings become ``outer/inner`` keys; non-finite floats become None (JSON has no NaN)."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}/"))
        elif isinstance(value, (bool, str)) or value is None:
            flat[name] = value
        elif isinstance(value, (int, float)) or hasattr(value, "__float__"):
            number = value if isinstance(value, int) else float(value)
            flat[name] = number if isinstance(number, int) or math.isfinite(number) else None
        else:
            raise TypeError(f"metric {name!r} is a {type(value).__name__}; log numbers, strings, bools or mappings of them")
    return flat


def read_metrics(out_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of out_dir/metrics.jsonl in order; a torn last line (a crash mid-write) is skipped."""
    return [r for r in read_records(Path(out_dir) / METRICS_FILE) if isinstance(r, dict) and isinstance(r.get("step"), int)]


class MetricsSink:
    """Writes step records to metrics.jsonl and TensorBoard under ``out_dir``."""

    def __init__(self, out_dir: str | os.PathLike, jsonl: bool = True, tensorboard: bool = True,
                 resume_step: int | None = None):
        self.out_dir = Path(out_dir).expanduser()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.last_step = self._recover(resume_step) if jsonl else resume_step
        self._file = open(self.out_dir / METRICS_FILE, "a", buffering=1) if jsonl else None  # line-buffered
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if self.last_step is None else self.last_step + 1
            self._tb = SummaryWriter(str(self.out_dir / TB_DIR), purge_step=purge)

    @classmethod
    def from_config(cls, logging_cfg: Any, resume_step: int | None = None) -> "MetricsSink":
        return cls(logging_cfg.out_dir, logging_cfg.jsonl, logging_cfg.tensorboard, resume_step)

    def _recover(self, resume_step: int | None) -> int | None:
        records = read_metrics(self.out_dir)
        kept = records if resume_step is None else [r for r in records if r["step"] <= resume_step]
        path = self.out_dir / METRICS_FILE
        if len(kept) != len(records):  # resumed before the last step logged: its later records go
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
            os.replace(tmp, path)  # atomic: a crash here leaves the old file or the new one
            log.info("metrics: resumed at step %d, removed %d later record(s)", resume_step, len(records) - len(kept))
        else:
            cut_torn_line(path)  # it would glue onto the next record
        return resume_step if resume_step is not None else max((r["step"] for r in kept), default=None)

    def log(self, step: int, metrics: Mapping[str, Any], stage: str | None = None) -> bool:
        """Write one step's record; False (and nothing written) for a step already logged."""
        if self.last_step is not None and step <= self.last_step:
            log.warning("metrics: step %d is already logged (last %d); skipped", step, self.last_step)
            return False
        flat = flatten(metrics)
        record = {"step": step, "time": time.time(), **({"stage": stage} if stage else {}), **flat}
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for name, value in flat.items():
                if isinstance(value, (int, float)):  # bools are ints: logged as 0/1
                    self._tb.add_scalar(name, float(value), step)
            self._tb.flush()
        self.last_step = step
        return True

    def log_side(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Scalars of a side measurement (a held-out sweep) to TensorBoard at ``step``, which may be
        logged already: they are not a step record (launch/heldout.py keeps their JSONL)."""
        if self._tb is not None:
            for name, value in flatten(metrics).items():
                if isinstance(value, (int, float)):
                    self._tb.add_scalar(name, float(value), step)
            self._tb.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> "MetricsSink":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

