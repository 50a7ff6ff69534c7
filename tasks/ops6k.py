"""Task sets in the released CUDA-Agent-Ops-6K layout: parquet rows, each holding a KernelBench-style program.

Read from a local path (nothing is downloaded). The program column is found by name (one of
PROGRAM_COLUMNS) or, failing that, as the first text column whose first row defines
``class Model``; a row's id comes from an id column when there is one, else its row number.
Rows are parsed as the loader parses a problem file, not run: ``cuda-agent tasks check``
runs them.
"""
from __future__ import annotations

from pathlib import Path

PROGRAM_COLUMNS = ("code", "program", "pytorch_code", "torch_code", "reference", "source", "task")
ID_COLUMNS = ("id", "task_id", "name", "op_name", "uid")


class ParquetLayoutError(ValueError):
    """A parquet file without a column of programs."""


def read_programs(path: Path) -> list[tuple[str, str]]:
    """(task id, program text) per row: ids are ``<file stem>/<row id>``."""
    try:
        import pyarrow.parquet as pq
    except ImportError as err:  # a dependency of the package; absent only in a partial install
        raise ParquetLayoutError("reading parquet task sets needs pyarrow: pip install pyarrow") from err
    table = pq.read_table(path)
    columns = {name.lower(): name for name in table.column_names}
    program = next((columns[c] for c in PROGRAM_COLUMNS if c in columns), None) or _sniffed(table)
    if program is None:
        raise ParquetLayoutError(f"no column of programs (one of {list(PROGRAM_COLUMNS)}, or text defining class Model) "
                                 f"among {table.column_names}")
    ident = next((columns[c] for c in ID_COLUMNS if c in columns), None)
    programs = table.column(program).to_pylist()
    ids = table.column(ident).to_pylist() if ident else list(range(len(programs)))
    width = len(str(len(programs)))
    return [(f"{path.stem}/{_safe(i, width)}", text or "") for i, text in zip(ids, programs)]


def _sniffed(table) -> str | None:
    for name in table.column_names:
        values = table.column(name).slice(0, 1).to_pylist()
        if values and isinstance(values[0], str) and "class Model" in values[0]:
            return name
    return None


def _safe(value, width: int) -> str:
    text = f"{value:0{width}d}" if isinstance(value, int) else str(value)
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:100]
