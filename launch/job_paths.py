"""Every path a job reads or writes, made to mean on the head what it meant where ``cuda-agent submit`` was typed.

A job's driver runs on the head in a temporary copy of the package (its ``working_dir``): a
relative path there would be taken against that copy, not the folder it was typed in
(``synth.kernelbench_dir=../../kb`` pointed nowhere, and the contamination screen was skipped).
So, before the job is submitted, each path-valued key and option:

- absolute: kept;
- starting with ``~``: kept, for the node that reads it to expand (the caches' defaults: each
  node keeps its own under its home);
- relative: taken against the current folder, as the command run here would take it. What that
  names inside the package folder, and travels with it (not in ``job.excludes`` or .gitignore),
  is given relative to the package, where the job runs, so it is right on any head; anything
  else is made absolute, right on the head when it is this machine or shares the path.

Run folders (``storage.root`` and what goes under it) and caches are written, never into the
package's copy: those are always made absolute. ``PATH_KEYS`` names every path-valued key of
the schema (tests/test_job_paths.py checks that no string key is left unclassified).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from omegaconf import DictConfig, OmegaConf

from configs.load import RUN_FOLDERS

READ = ("model.path", "model.critic_path", "synth.kernelbench_dir")  # files or folders the job reads
READ_LISTS = ("stage.tasks", "eval.tasks", "eval.heldout_tasks")  # problem files or folders
SPECS = ("eval.policy", "synth.policy")  # policy specs whose vllm:DIR or replay:FILE names a path
WRITTEN = ("model.cache_dir", "env.work_dir", "env.pch_dir", "storage.node_dir", "synth.trace_cache")  # caches each node writes
NOT_PATHS = {"model.path": ("embedded",), "env.pch_dir": ("",), "synth.trace_cache": ("",)}  # values that name no path
PATH_KEYS = (*READ, *READ_LISTS, *SPECS, *WRITTEN, "storage.root", *RUN_FOLDERS, "job.python")  # job.python: launch/job_python.py


class Paths:
    """Resolution against ``cwd``, for a package at ``package`` uploaded without ``excludes``."""

    def __init__(self, cwd: Path, package: Path, excludes: Iterable[str]):
        from ray._private.runtime_env.packaging import _get_excludes, _get_ignore_file

        self.cwd, self.package = Path(cwd).absolute(), Path(package).resolve()
        # Ray's own matchers for what it leaves out of the working_dir it uploads (the package
        # root's ignore files; the few nested ones it also reads do not name inputs).
        found = (_get_ignore_file(self.package, name) for name in (".gitignore", ".rayignore"))
        self.left_out = [_get_excludes(self.package, list(excludes)), *(m for m in found if m is not None)]

    def read(self, value: str) -> str:
        """A path the job reads: package-relative where the package carries it, else absolute."""
        if not value or value.startswith("~") or Path(value).is_absolute():
            return value
        here = Path(os.path.normpath(self.cwd / value))
        try:
            inside = here.resolve().relative_to(self.package)
        except ValueError:
            return str(here)
        # Ray walks the folder from its top and skips a folder it leaves out with all it holds.
        carried = not any(e(self.package.joinpath(*inside.parts[:i + 1])) for i in range(len(inside.parts))
                          for e in self.left_out)
        return inside.as_posix() if carried and inside.parts else str(here)

    def written(self, value: str) -> str:
        """A path the job writes: absolute (a relative one would land in the job's temporary copy)."""
        if not value or value.startswith("~") or Path(value).is_absolute():
            return value
        return os.path.normpath(self.cwd / value)

    def spec(self, value: str) -> str:
        """A policy spec with its path resolved (vllm:DIR, replay:FILE); vllm:embedded and openai: as they are."""
        kind, sep, target = value.partition(":")
        if kind in ("vllm", "replay") and sep and target and target != "embedded":
            return f"{kind}:{self.read(target)}"
        return value


def resolve_paths(cfg: DictConfig, paths: Paths) -> None:
    """Every path-valued key of ``cfg`` resolved in place; storage.root and the run folders absolute."""
    def update(key: str, how) -> None:
        value = OmegaConf.select(cfg, key)
        if value is not None and value not in NOT_PATHS.get(key, ()):
            OmegaConf.update(cfg, key, how(str(value)))

    for key in READ:
        update(key, paths.read)
    for key in READ_LISTS:
        OmegaConf.update(cfg, key, [paths.read(str(p)) for p in OmegaConf.select(cfg, key) or []])
    for key in SPECS:
        update(key, paths.spec)
    for key in WRITTEN:
        update(key, paths.written)
    # load_config has put relative run folders under storage.root already (configs/load.py
    # under_root): one still relative is relative to the current folder, as the root itself.
    cfg.storage.root = str(Path(paths.written(str(cfg.storage.root) or ".")).expanduser())
    for key in RUN_FOLDERS:
        OmegaConf.update(cfg, key, str(Path(paths.written(OmegaConf.select(cfg, key))).expanduser()))
