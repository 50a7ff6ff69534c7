"""Our baselines against KernelBench's published ones: a ratio per problem, a summary per level.

    python scripts/compare_baselines.py RUN_DIR [RUN_DIR ...] --out DIR [--timing ../shared/kernelbench/results/timing/H100_Modal]

Each RUN_DIR is a ``cuda-agent eval`` output (results.jsonl: eager_ms and compiled_ms per problem,
as the environment measured them). KernelBench times each reference with CUDA events around
the forward call, 100 trials, no cache flush, and publishes the mean (baseline_time_torch.json,
baseline_time_torch_compile_inductor_default.json). Writes DIR/baselines.md and
DIR/baselines.json; the ratio is ours / theirs.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

FILES = {"eager": "baseline_time_torch.json", "compile": "baseline_time_torch_compile_inductor_default.json"}
CLOSE = (0.8, 1.25)  # a ratio in this band counts as agreeing


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def load_published(timing: Path) -> dict[str, dict[str, float]]:
    """kind -> "levelL/NAME" -> mean ms."""
    out: dict[str, dict[str, float]] = {}
    for kind, name in FILES.items():
        data = json.loads((timing / name).read_text())
        out[kind] = {f"{level}/{problem.removesuffix('.py')}": row["mean"]
                     for level, problems in data.items() for problem, row in problems.items()}
    return out


def load_ours(runs: list[Path]) -> dict[str, dict[str, float]]:
    """task id -> {"eager": ms, "compile": ms}, the last record of each task with a baseline."""
    ours: dict[str, dict[str, float]] = {}
    for run in runs:
        for line in (run / "results.jsonl").read_text().splitlines():
            r = json.loads(line)
            if r.get("eager_ms"):  # keyed as KernelBench's files are, whatever folder the sweep was given
                ours[f"level{r['level']}/{r['task_id'].rsplit('/', 1)[-1]}"] = {"eager": r["eager_ms"], "compile": r.get("compiled_ms") or 0.0}
    return ours


def compare(ours: dict[str, dict[str, float]], published: dict[str, dict[str, float]]) -> list[dict]:
    rows = []
    for task_id, mine in sorted(ours.items(), key=lambda kv: _order(kv[0])):
        row = {"task": task_id}
        for kind in FILES:
            theirs = published[kind].get(task_id)
            row[f"{kind}_ours_ms"], row[f"{kind}_kb_ms"] = mine[kind] or None, theirs
            row[f"{kind}_ratio"] = mine[kind] / theirs if mine[kind] and theirs else None
        rows.append(row)
    return rows


def _order(task_id: str) -> tuple[str, int]:
    level, name = task_id.split("/", 1)
    return level, int(name.split("_", 1)[0]) if name[0].isdigit() else 0


def summary(rows: list[dict]) -> list[dict]:
    out = []
    for level in sorted({r["task"].split("/")[0] for r in rows}) + ["all"]:
        mine = [r for r in rows if level == "all" or r["task"].startswith(level + "/")]
        entry = {"level": level, "problems": len(mine)}
        for kind in FILES:
            ratios = [r[f"{kind}_ratio"] for r in mine if r[f"{kind}_ratio"]]
            entry[f"{kind}_compared"] = len(ratios)
            entry[f"{kind}_geomean_ratio"] = geomean(ratios)
            entry[f"{kind}_within_band"] = sum(CLOSE[0] <= x <= CLOSE[1] for x in ratios)
            entry[f"{kind}_slower"] = sum(x > CLOSE[1] for x in ratios)
            entry[f"{kind}_faster"] = sum(x < CLOSE[0] for x in ratios)
        out.append(entry)
    return out


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def markdown(rows: list[dict], levels: list[dict]) -> str:
    lines = ["# Baselines: ours against KernelBench's published H100 timings", "",
             f"Ratio = ours / KernelBench's; within band means {CLOSE[0]}-{CLOSE[1]}.", "",
             "| level | problems | eager: geomean ratio | within / slower / faster | compile: geomean ratio | within / slower / faster |",
             "|---|---|---|---|---|---|"]
    for e in levels:
        lines.append(f"| {e['level']} | {e['problems']} | {_fmt(e['eager_geomean_ratio'])} | "
                     f"{e['eager_within_band']} / {e['eager_slower']} / {e['eager_faster']} | {_fmt(e['compile_geomean_ratio'])} | "
                     f"{e['compile_within_band']} / {e['compile_slower']} / {e['compile_faster']} |")
    lines += ["", "| problem | eager ours ms | eager KB ms | ratio | compile ours ms | compile KB ms | ratio |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['task']} | {_fmt(r['eager_ours_ms'])} | {_fmt(r['eager_kb_ms'])} | {_fmt(r['eager_ratio'])} | "
                     f"{_fmt(r['compile_ours_ms'])} | {_fmt(r['compile_kb_ms'])} | {_fmt(r['compile_ratio'])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timing", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "kernelbench"
                        / "results" / "timing" / "H100_Modal")
    args = parser.parse_args()
    rows = compare(load_ours(args.runs), load_published(args.timing))
    levels = summary(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "baselines.json").write_text(json.dumps({"levels": levels, "problems": rows}, indent=1))
    text = markdown(rows, levels)
    (args.out / "baselines.md").write_text(text)
    print("\n".join(text.splitlines()[:12]))


if __name__ == "__main__":
    main()
