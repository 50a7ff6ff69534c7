"""The agent's workspace: one folder per episode, the only files the agent's tools touch.

It holds the task's ``reference.py`` and ``SKILL.md`` (read-only to the agent) and the files
the agent writes: ``model_new.py``, the backend's kernel source (``kernel.cpp`` or
``kernel.cu``), headers it includes, helper ``.py`` modules, and notes. ``solution_files()``
is what the environment's evaluation takes (``EnvClient.evaluate``); the evaluation copies them
into a scratch folder of its own, so nothing here is ever run in place. The verifier's seeds and
expected outputs live under the environment's private folder, never here.

It lives in rollout, not in env_pool: only the agent's tools and the episode runner use it, and
what crosses to the environment is the plain dict of ``solution_files()``. The file names both
sides must agree on are the solution format's (tasks/solution.py).

Names are flat (no sub-folders): the compiler and the evaluation take plain file names, and a
flat namespace leaves no room for path tricks. Every rule broken raises ``WorkspaceError``
with the rule and the fix, which the tools pass on to the agent verbatim.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from tasks.solution import KERNEL_FILES, SOLUTION_FILE
from tasks.task import Task

REFERENCE_FILE = "reference.py"
SKILL_FILE = "SKILL.md"
PROTECTED = (REFERENCE_FILE, SKILL_FILE)
NOTE_SUFFIXES = (".md", ".txt")  # the agent's own notes: kept, never evaluated
MAX_FILE_BYTES = 256 << 10  # far above any kernel; bounds what one write can make us store
MAX_FILES = 32
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
_EPISODE_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


class WorkspaceError(ValueError):
    """A file operation the workspace refuses; the message says the rule and the fix."""


def default_root(env_work_dir: str | Path = "~/.cache/cuda-agent/env") -> Path:
    """Where workspaces live by default: beside the environment's compile cache and scratch."""
    return Path(os.path.expanduser(str(env_work_dir))) / "workspaces"


@dataclass
class Workspace:
    path: Path
    task: Task
    backend: str

    @classmethod
    def create(cls, root: str | Path, episode_id: str, task: Task, backend: str, skill_text: str) -> "Workspace":
        """A fresh workspace for one episode (one left by an earlier run of the same id is replaced)."""
        backend = str(backend)  # configs.schema.Backend or its name
        if backend not in KERNEL_FILES:
            raise ValueError(f"unknown backend {backend!r}; expected one of {sorted(KERNEL_FILES)}")
        if not _EPISODE_ID.match(episode_id) or ".." in episode_id:
            raise ValueError(f"episode_id {episode_id!r} must be a plain name (letters, digits, '_', '-', '.')")
        path = Path(os.path.expanduser(str(root))) / episode_id
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        for name, text in ((REFERENCE_FILE, task.source), (SKILL_FILE, skill_text)):
            (path / name).write_text(text)
            (path / name).chmod(0o444)
        return cls(path=path, task=task, backend=backend)

    # -- what the agent may do ------------------------------------------------------------

    def list_files(self) -> list[tuple[str, int, bool]]:
        """(name, size in bytes, writable) of every file, sorted by name."""
        entries = []
        for p in sorted(self.path.iterdir()):
            if p.is_file() and not p.is_symlink() and not p.name.startswith("."):  # ".x.tmp": a write in progress
                entries.append((p.name, p.stat().st_size, p.name not in PROTECTED))
        return entries

    def read(self, name: str) -> str:
        name, target = self._resolve(name)
        if not target.exists():
            present = ", ".join(n for n, _, _ in self.list_files())
            raise WorkspaceError(f"no file named {name!r} in the workspace; the files are: {present}")
        return target.read_text(errors="replace")

    def write(self, name: str, text: str) -> int:
        """Write a file the agent may write; returns its size in bytes."""
        name, target = self._resolve(name)
        if name in PROTECTED:
            raise WorkspaceError(f"{name} is read-only: it belongs to the environment. "
                                 f"Write your solution to {SOLUTION_FILE} and {self.kernel_source}")
        self._check_writable_name(name)
        data = text.encode("utf-8", errors="replace")
        if len(data) > MAX_FILE_BYTES:
            raise WorkspaceError(f"{name} would be {len(data)} bytes; the limit is {MAX_FILE_BYTES} per file. "
                                 "Write smaller files (split helpers into headers)")
        if not target.exists() and len(self.list_files()) >= MAX_FILES:
            raise WorkspaceError(f"the workspace already holds {MAX_FILES} files, the limit; overwrite an existing file instead")
        tmp = target.with_name(f".{name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)  # atomic: a concurrent evaluation never reads half a file
        return len(data)

    def solution_files(self) -> dict[str, str]:
        """What the evaluation takes: model_new.py, kernel sources and headers, helper modules."""
        return {name: (self.path / name).read_text(errors="replace") for name, _, _ in self.list_files()
                if name not in PROTECTED and not name.endswith(NOTE_SUFFIXES)}

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    # -- rules ----------------------------------------------------------------------------

    @property
    def kernel_source(self) -> str:
        return KERNEL_FILES[self.backend].source

    @property
    def allowed_suffixes(self) -> tuple[str, ...]:
        return (".py", *KERNEL_FILES[self.backend].headers, *NOTE_SUFFIXES)

    def _resolve(self, name: object) -> tuple[str, Path]:
        """(the plain file name, its path), or WorkspaceError saying which rule the name breaks."""
        if not isinstance(name, str) or not name:
            raise WorkspaceError("the path must be a non-empty file name such as 'kernel.cpp'")
        if name.startswith(("/", "~")) or re.match(r"^[A-Za-z]:", name):
            raise WorkspaceError(f"{name!r} is an absolute path; use a plain file name inside the workspace, e.g. "
                                 f"{self.kernel_source!r}")
        if ".." in re.split(r"[/\\]", name):
            raise WorkspaceError(f"{name!r} leaves the workspace ('..'); use a plain file name such as {self.kernel_source!r}")
        name = name.removeprefix("./")
        if "/" in name or "\\" in name:
            raise WorkspaceError(f"{name!r} names a sub-folder; the workspace is flat: use a plain file name such as "
                                 f"{self.kernel_source!r}")
        if not _NAME.match(name):
            raise WorkspaceError(f"{name!r} is not an allowed file name: use letters, digits, '_', '-' and '.', "
                                 "starting with a letter, digit or '_' (at most 100 characters)")
        target = self.path / name
        if target.is_symlink() or (target.exists() and not stat.S_ISREG(target.lstat().st_mode)):
            raise WorkspaceError(f"{name!r} is not a regular file; links and special files are not allowed")
        return name, target

    def _check_writable_name(self, name: str) -> None:
        other = {"cpp": "cuda", "cuda": "cpp"}[self.backend]
        if name == KERNEL_FILES[other].source:
            raise WorkspaceError(f"{name} is the {other} backend's kernel source; this task runs on the {self.backend} "
                                 f"backend, which compiles {self.kernel_source}")
        if name == SOLUTION_FILE:
            return
        if name.endswith(".py"):
            return self._check_module_name(name)
        if name == self.kernel_source or name.endswith(self.allowed_suffixes):
            return
        allowed = ", ".join(f"*{s}" for s in self.allowed_suffixes)
        raise WorkspaceError(f"{name!r} is not a file this backend uses. Write {SOLUTION_FILE} (class ModelNew), "
                             f"{self.kernel_source} (your kernels, compiled to kernel.so), or {allowed}")

    @staticmethod
    def _check_module_name(name: str) -> None:
        stem = name[:-3]
        if not stem.isidentifier():
            raise WorkspaceError(f"{name!r} cannot be imported: a Python module name is an identifier, e.g. 'helpers.py'")
        # The candidate's folder comes first on sys.path when its process starts: a file named
        # like a real module (torch.py, ctypes.py) would replace that module for everything in it.
        if stem in sys.stdlib_module_names or _importable(stem):
            raise WorkspaceError(f"{name!r} has the name of an existing Python module ({stem}) and would shadow it; "
                                 "choose another name, e.g. 'my_helpers.py'")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
