#!/usr/bin/env bash
# The environment's H100 figures (issues 14 and 18) in parts that each fit one 10-minute device
# call, after the gpu-stack activation (the sweep needs Ray). KernelBench travels as the ignored
# folder .kb/kernelbench (../shared does not travel):
#   . .gpu-stack/bin/activate && bash scripts/gpu_env_figures.sh build        # load_inline cold build, each command timed
#   . .gpu-stack/bin/activate && bash scripts/gpu_env_figures.sh sweep-start  # the KernelBench sweep, in the background
#   bash scripts/gpu_env_figures.sh sweep-wait SECONDS                         # its progress, until it ends or SECONDS pass
#   . .gpu-stack/bin/activate && bash scripts/gpu_env_figures.sh sweep-report # the eval report and the baseline comparison
# The sweep runs in its own session (setsid), so it outlives the call that starts it while the
# machine stays warm; results.jsonl grows one line per problem, and a later start resumes it.
# Results go to $OUT (or ./gpu-figures); each part ends with a short table.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-$PWD/gpu-figures}"
KB="${KB:-$PWD/.kb/kernelbench}"
RUN=/tmp/kb-sweep  # on the GPU machine's disk: it lasts as long as the machine
mkdir -p "$OUT" "$RUN"

done_count() { cat "$RUN"/l*/eval/results.jsonl 2>/dev/null | wc -l; }

case "${1:?build, sweep-start, sweep-wait SECONDS or sweep-report}" in
build)
  python3 scripts/bench_inline_build.py --out "$OUT" 2>&1 | tail -16
  ;;
sweep-start)
  # two sweeps, one after the other: level 1 (the known kernels, audited and reported whole),
  # then levels 2 and 3 (reference copies: their baselines, as far as the lease goes)
  setsid nohup bash -c "bash scripts/kernelbench_sweep.sh '$KB' '$RUN/l1' '$KB/level1' -- logging.progress=false;
    bash scripts/kernelbench_sweep.sh '$KB' '$RUN/l23' '$KB/level2' '$KB/level3' -- logging.progress=false" \
    > "$RUN/sweep.log" 2>&1 < /dev/null &
  sleep 30; tail -5 "$RUN/sweep.log"
  ;;
sweep-wait)
  end=$(( $(date +%s) + ${2:?seconds} ))
  while [ "$(date +%s)" -lt "$end" ] && pgrep -f kernelbench_sweep.sh > /dev/null; do
    echo "$(date +%T) problems done: $(done_count)"; sleep 60
  done
  echo "problems done: $(done_count); sweep running: $(pgrep -f kernelbench_sweep.sh > /dev/null && echo yes || echo no)"
  tail -3 "$RUN/sweep.log"
  ;;
sweep-report)
  pkill -INT -f "launch.cli eval" && sleep 20  # a sweep still running stops cleanly; its results so far stay
  # a stopped sweep writes no report: write it for the problems it finished
  for part in l1 l23; do
    [ -f "$RUN/$part/eval/results.jsonl" ] && [ ! -f "$RUN/$part/eval/report.md" ] && python3 -m launch.cli eval \
      configs/gpu-1xh100.yaml --report-only --solutions "$RUN/$part/solutions" --tasks $([ $part = l1 ] && echo "$KB/level1" || echo "$KB/level2 $KB/level3") --out "$RUN/$part/eval" eval.max_autotune=false 2>&1 | tail -2
  done
  python3 scripts/compare_baselines.py "$RUN"/l*/eval --out "$RUN" --timing "$KB/results/timing/H100_Modal" | tail -3
  cp "$RUN/l1/eval/results.jsonl" "$OUT/l1_results.jsonl"; cp "$RUN/l23/eval/results.jsonl" "$OUT/l23_results.jsonl"
  cp "$RUN/l1/eval/report.html" "$OUT/l1_report.html"; cp "$RUN/l1/eval/report.md" "$OUT/l1_report.md"
  cp "$RUN/baselines.md" "$RUN/baselines.json" "$RUN/sweep.log" "$OUT/"
  grep -A12 -i "^## " "$RUN/baselines.md" | head -30; grep -m12 "" "$RUN/l1/eval/report.md"
  ;;
esac
