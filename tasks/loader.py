"""Load KernelBench-format problem files from files or folders, reporting those that fail and why."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from tasks.task import BACKENDS, EntryPoints, Task, TaskError

STARTER_PACKAGE = "tasks.starter"
_LEVEL_DIR = re.compile(r"^level[_-]?(\d)$", re.IGNORECASE)


@dataclass(frozen=True)
class LoadFailure:
    path: str
    reason: str


def starter_dir() -> Path:
    """The starter set shipped inside the package."""
    return Path(str(resources.files(STARTER_PACKAGE)))


def numbered(task_id: str) -> tuple[float, str]:
    """A key that orders problems by KernelBench's number (2_ before 10_, then by name); unnumbered ones last."""
    number = task_id.rsplit("/", 1)[-1].partition("_")[0]
    return (int(number) if number.isdigit() else float("inf"), task_id)


def load_tasks(paths: Iterable[str | Path] = ()) -> tuple[list[Task], list[LoadFailure]]:
    """Load every problem under ``paths`` (files or folders, searched recursively).

    With no paths, loads the shipped starter set. Never raises for a bad file: each one
    becomes a LoadFailure with the reason, so one broken problem does not hide the rest.
    """
    roots = [Path(p) for p in paths] or [starter_dir()]
    tasks: list[Task] = []
    failures: list[LoadFailure] = []
    seen: dict[str, str] = {}
    for root in roots:
        if not root.exists():
            failures.append(LoadFailure(str(root), "no such file or folder"))
            continue
        base = root if root.is_dir() else root.parent
        for file in _problem_files(root):
            for where, task in _tasks_in(file, base, failures):
                if task.id in seen:
                    failures.append(LoadFailure(where, f"duplicate task id {task.id!r} (also {seen[task.id]})"))
                    continue
                seen[task.id] = where
                tasks.append(task)
    return tasks, failures


def _tasks_in(file: Path, base: Path, failures: list[LoadFailure]) -> list[tuple[str, Task]]:
    """(where, task) for each problem in ``file``: one for a .py file, one per row of a parquet task set."""
    if file.suffix != ".parquet":
        try:
            return [(str(file), load_task_file(file, base=base))]
        except TaskError as err:
            failures.append(LoadFailure(str(file), str(err)))
            return []
    from tasks.ops6k import ParquetLayoutError, read_programs

    try:
        rows = read_programs(file)
    except (ParquetLayoutError, OSError) as err:
        failures.append(LoadFailure(str(file), str(err)))
        return []
    found = []
    for task_id, source in rows:
        try:
            found.append((f"{file}#{task_id}", parse_task(source, task_id)))
        except TaskError as err:
            failures.append(LoadFailure(f"{file}#{task_id}", str(err)))
    return found


def _problem_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(p for pattern in ("*.py", "*.parquet") for p in root.rglob(pattern)
                  if not p.name.startswith("_") and "__pycache__" not in p.parts)


def load_task_file(path: Path, base: Path | None = None) -> Task:
    """Parse one problem file into a Task; raise TaskError naming what is wrong."""
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise TaskError(f"cannot read: {err}") from err
    rel = path.relative_to(base) if base and path.is_relative_to(base) else Path(path.name)
    task = parse_task(source, rel.with_suffix("").as_posix(), path)
    from tasks.describe import describe_task  # executes the file; kept out of the parse above

    for backend in BACKENDS:
        describe_task(task, backend)  # raises TaskError if the model or inputs cannot be built
    return task


def parse_task(source: str, task_id: str, path: Path | None = None) -> Task:
    """A Task from a problem's text, without running it; raise TaskError naming what is wrong."""
    try:
        tree = ast.parse(source, filename=str(path or task_id))
    except SyntaxError as err:
        raise TaskError(f"syntax error at line {err.lineno}: {err.msg}") from err
    entry = EntryPoints()
    defined = _top_level_names(tree)
    missing = [n for n in (entry.model, entry.inputs, entry.init_inputs) if n not in defined]
    if missing:
        raise TaskError(
            f"missing {', '.join(missing)}: a KernelBench problem defines class Model(nn.Module), "
            "get_inputs() and get_init_inputs()"
        )
    constants = _literal_constants(tree, ("PRESETS", "TOLERANCE", "LEVEL"))
    presets = _check_presets(constants.get("PRESETS", {}))
    tolerance = constants.get("TOLERANCE", {})
    if not isinstance(tolerance, dict) or set(tolerance) - {"atol", "rtol"}:
        raise TaskError('TOLERANCE must be a dict literal with keys "atol" and/or "rtol"')
    return Task(
        id=task_id,
        level=_level(path or Path(task_id), constants.get("LEVEL")),
        source=source,
        path=str(path or ""),
        entry=entry,
        presets=presets,
        atol=tolerance.get("atol"),
        rtol=tolerance.get("rtol"),
    )


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _literal_constants(tree: ast.Module, names: tuple[str, ...]) -> dict[str, Any]:
    """Read optional metadata as literals, without running the file."""
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in names:
                try:
                    found[name] = ast.literal_eval(node.value)
                except ValueError as err:
                    raise TaskError(f"{name} must be a literal (numbers, strings, dicts): {err}") from err
    return found


def _check_presets(presets: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(presets, dict) or not all(isinstance(v, dict) for v in presets.values()):
        raise TaskError('PRESETS must be a dict of backend -> dict of overrides, e.g. {"cpp": {"N": 1024}}')
    return presets


def _level(path: Path, declared: Any) -> int:
    if declared is not None:
        if declared not in (1, 2, 3, 4):
            raise TaskError(f"LEVEL must be 1-4, got {declared!r}")
        return int(declared)
    for part in reversed(path.parent.parts):
        match = _LEVEL_DIR.match(part)
        if match:
            return int(match.group(1))
    return 0
