#!/usr/bin/env bash
# A KernelBench sweep of known solutions on a GPU, and our baselines against KernelBench's published ones.
#
#   bash scripts/kernelbench_sweep.sh KERNELBENCH_DIR RUN_DIR [LEVEL_FOLDER ...] [-- key=value ...]
#
# On a machine of several GPUs each times its share of the problems (one env worker each).
# Writes the solutions (scripts/kernelbench_solutions.py: real kernels for level 1's activations,
# reference copies elsewhere, which must be refused) to RUN_DIR/solutions, runs `cuda-agent eval
# --solutions` on the GPU preset into RUN_DIR/eval (resumable: run it again to continue), and
# compares the baselines into RUN_DIR (baselines.md, baselines.json).
set -euo pipefail
kb=$1; run=$2; shift 2
folders=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do folders+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#folders[@]} -gt 0 ] || folders=("$kb/level1")
here="$(cd "$(dirname "$0")/.." && pwd)"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
[ -d "$run/solutions" ] || python "$here/scripts/kernelbench_solutions.py" --out "$run/solutions" --levels 1 2 3 --kernelbench "$kb"
# Every problem's torch.compile baseline compiled first, side by side on the host's CPUs, into the
# worker's own inductor cache (env.work_dir/reference): nothing is timed yet, and each trusted
# server then loads its compile instead of compiling with the timing lane held (5-60 s a problem).
# Only the problems a resumed sweep has still to judge: on a fresh machine, compiling all of level 1 again took minutes.
work=~/.cache/cuda-agent/env
for kv in "$@"; do case $kv in env.work_dir=*) work=${kv#env.work_dir=};; esac; done
mapfile -t ahead < <(python - "$run/eval/results.jsonl" "${folders[@]}" <<'PY'
import sys
from pathlib import Path
from protocol.records import read_records
done = {r["task_id"] for r in read_records(Path(sys.argv[1])) if r["failure"] != "infra"}  # as the sweep decides what to run again
for path in map(Path, sys.argv[2:]):
    for problem in sorted(path.glob("*.py")) if path.is_dir() else [path]:
        if problem.stem not in done:
            print(problem)
PY
)
[ ${#ahead[@]} -eq 0 ] || python "$here/scripts/kernelbench_baselines.py" --out "${work/#\~/$HOME}/reference" --stage compile \
  --tasks "${ahead[@]}" | tail -1 || echo "the compile ahead failed: each baselines server compiles its own"
# One env worker (one timing lane) per GPU, each on its own share of the CPUs (cluster.num_env_workers= overrides).
gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true); gpus=$(( gpus > 0 ? gpus : 1 ))
python -m launch.cli eval "$here/configs/gpu-1xh100.yaml" --solutions "$run/solutions" --tasks "${folders[@]}" --out "$run/eval" \
  eval.max_autotune=false cluster.num_env_workers=$gpus "$@"
python "$here/scripts/compare_baselines.py" "$run/eval" --out "$run" --timing "$kb/results/timing/H100_Modal" --tasks "${folders[@]}"
