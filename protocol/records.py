"""JSONL run records (metrics, episodes, sweep results, audits, synthesis manifests): one JSON
object a line, appended and flushed as each arrives, so a crash loses only what was in flight.

A run killed mid-write leaves a torn last line: readers skip it, and a writer cuts it off before
its first append (else the next record would glue onto it and both be lost).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every whole record of a JSONL file, in order; a torn line (a run killed mid-write) is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s: skipping a line that does not parse (a run killed mid-write?)", path)
    return records


def cut_torn_line(path: Path) -> bool:
    """Cut a torn last line off ``path`` (before an append); True if there was one."""
    if not path.exists():
        return False
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return False
    with open(path, "r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)
    return True


class RecordWriter:
    """Appends one record a line, flushed at once; cuts a torn last line before the first append."""

    def __init__(self, path: str | Path):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        cut_torn_line(path)
        self.file = open(path, "a")

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
