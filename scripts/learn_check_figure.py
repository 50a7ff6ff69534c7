"""Learning-check runs side by side: the reward's 3-step mean by step and by seconds, a threshold across.

    python scripts/learn_check_figure.py "synchronous=runs/learn-check" "asynchronous=runs/learn-check-async" \\
        --threshold 0.6 --out learn-check.png

Each run is LABEL=FOLDER, the folder a `cuda-agent train learn-check` run wrote (its metrics.jsonl).
The legend says at which step and second each run first reached the threshold (README: the
learning check's synchronous against asynchronous figure).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launch.metrics import read_metrics  # noqa: E402
from launch.plots import comparison_figure  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="LABEL=FOLDER")
    parser.add_argument("--threshold", type=float, default=0.6, help="the 3-step mean reward to reach (default 0.6)")
    parser.add_argument("--window", type=int, default=3, help="steps in the running mean (default 3)")
    parser.add_argument("--title", default="", help="above both panels, e.g. the machine")
    parser.add_argument("--out", type=Path, default=Path("learn-check.png"))
    args = parser.parse_args()
    runs = {}
    for item in args.runs:
        label, sep, folder = item.partition("=")
        if not sep or not folder:
            parser.error(f"{item!r}: give LABEL=FOLDER, e.g. synchronous=runs/learn-check")
        records = read_metrics(folder)
        if not records:
            parser.error(f"{folder}: no metrics.jsonl with steps there (a `cuda-agent train learn-check` run's folder)")
        runs[label] = records
    comparison_figure(runs, args.window, args.threshold, args.title).savefig(args.out, bbox_inches="tight")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
