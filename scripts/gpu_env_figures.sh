#!/usr/bin/env bash
# The environment's H100 figures (issues 14 and 18) in parts that each fit one 10-minute device
# call, after the gpu-stack activation (the sweep needs Ray). KernelBench travels as the ignored
# folder .kb/kernelbench (../shared does not travel):
#   . .gpu-stack/bin/activate && bash scripts/gpu_env_figures.sh build        # load_inline cold build, each command timed
#   . .gpu-stack/bin/activate && bash scripts/gpu_env_figures.sh speed        # evaluation latency and throughput
#   . .gpu-stack/bin/activate && bash scripts/gpu_env_figures.sh sweep-start [PROBLEM ...]  # a KernelBench sweep, in the background
#   bash scripts/gpu_env_figures.sh sweep-wait SECONDS                         # its progress, until it ends or SECONDS pass
#   . .gpu-stack/bin/activate && bash scripts/gpu_env_figures.sh sweep-report # the eval report and the baseline comparison
#   bash scripts/gpu_env_figures.sh baselines-start STAGE CPUS [GPUS]  # kernelbench_baselines.py (needs torch only), in the background
#   bash scripts/gpu_env_figures.sh baselines-wait SECONDS             # its progress, until it ends or SECONDS pass
#   bash scripts/gpu_env_figures.sh baselines-report                   # the comparison of every problem's baselines
#   . .gpu-stack/bin/activate && bash scripts/gpu_env_figures.sh accounting NAME [TREE]  # level 1's activations, code at TREE (resumes)
#   . .gpu-stack/bin/activate && bash scripts/gpu_env_figures.sh tasks-check  # KernelBench's verification sets (tasks/discriminate.py)
# The sweep runs in its own session (setsid), so it outlives the call that starts it while the
# machine stays warm; results.jsonl grows one line per problem, and a later start resumes it.
# Across machines too (one goes back 30 s after a call, and a session's device time does not
# cover level 1's 100 problems): each sweep-wait returns the run as $OUT/sweep-state.tgz; put it
# in the ignored .kbrun/ here and carry .kbrun, and the next machine's sweep-start resumes it.
# On the H100 (2026-11-25) a problem's first evaluation, baselines included, took 25-65 s, one at a
# time on the timing lane: a call of ten minutes scores about 15, and all 250 take about three hours.
# Results go to $OUT (or ./gpu-figures); each part ends with a short table.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-$PWD/gpu-figures}"
KB="${KB:-$PWD/.kb/kernelbench}"
RUN=/tmp/kb-sweep  # on the GPU machine's disk: it lasts as long as the machine (.kbrun carries it to the next)
STATE=$PWD/.kbrun/sweep-state.tgz
mkdir -p "$OUT" "$RUN"

BASE=/tmp/kb-baselines  # kernelbench_baselines.py's folder, on the GPU machine's disk
done_count() { cat "$RUN"/*/eval/results.jsonl 2>/dev/null | wc -l; }

case "${1:?build, speed, sweep-start [PROBLEM ...], sweep-wait SECONDS, sweep-report, baselines-start STAGE CPUS [GPUS], baselines-wait SECONDS or baselines-report}" in
build)
  python3 scripts/bench_inline_build.py --out "$OUT" 2>&1 | tail -16
  ;;
speed)  # evaluation latency per mode, cold and warm, and throughput under load (load_inline: see build)
  python3 scripts/bench_env_speed.py --backend cuda --skip-inline --out "$OUT" warm_servers=6 2>&1 | tail -20  # as the GPU presets
  ;;
sweep-start)
  # PROBLEM files or folders (default: two sweeps, one after the other: level 1, the known
  # kernels, audited and reported whole; then levels 2 and 3, reference copies: their baselines)
  shift
  if [ $# -gt 0 ]; then parts=("picked:$*"); else parts=("l1:$KB/level1" "l23:$KB/level2 $KB/level3"); fi
  if [ -f "$STATE" ] && [ "$(done_count)" -eq 0 ]; then tar xzf "$STATE" -C / && echo "resumed: $(done_count) problems done"; fi
  script=""
  for part in "${parts[@]}"; do
    name=${part%%:*}; mkdir -p "$RUN/$name"; echo "${part#*:}" > "$RUN/$name/tasks.txt"
    script+="bash scripts/kernelbench_sweep.sh '$KB' '$RUN/$name' ${part#*:} -- logging.progress=false; "
  done
  setsid nohup bash -c "$script" > "$RUN/sweep.log" 2>&1 < /dev/null &
  sleep 30; tail -5 "$RUN/sweep.log"
  ;;
sweep-wait)
  end=$(( $(date +%s) + ${2:?seconds} ))
  while [ "$(date +%s)" -lt "$end" ] && pgrep -f kernelbench_sweep.sh > /dev/null; do
    echo "$(date +%T) problems done: $(done_count)"; sleep $(( end - $(date +%s) < 60 ? end - $(date +%s) : 60 ))
  done
  echo "problems done: $(done_count); sweep running: $(pgrep -f kernelbench_sweep.sh > /dev/null && echo yes || echo no)"
  tar czf "$OUT/sweep-state.tgz" --exclude=logs -C / "${RUN#/}"  # for .kbrun/: the next machine resumes from it
  tail -3 "$RUN/sweep.log"
  ;;
sweep-report)
  pkill -INT -f "launch.cli eval" && sleep 20  # a sweep still running stops cleanly; its results so far stay
  for dir in "$RUN"/*/; do
    part=$(basename "$dir"); [ -f "$dir/eval/results.jsonl" ] || continue
    # a stopped sweep writes no report: write it for the problems it finished
    [ -f "$dir/eval/report.md" ] || python3 -m launch.cli eval configs/gpu-1xh100.yaml --report-only \
      --solutions "$dir/solutions" --tasks $(cat "$dir/tasks.txt") --out "$dir/eval" eval.max_autotune=false 2>&1 | tail -2
    cp "$dir/eval/results.jsonl" "$OUT/${part}_results.jsonl"; cp "$dir/eval/report.md" "$OUT/${part}_report.md"
    cp "$dir/eval/report.html" "$OUT/${part}_report.html"
  done
  python3 scripts/compare_baselines.py "$RUN"/*/eval --out "$RUN" --timing "$KB/results/timing/H100_Modal" --tasks $(cat "$RUN"/*/tasks.txt) | tail -3
  cp "$RUN/baselines.md" "$RUN/sweep.log" "$OUT/"
  grep -B2 -A4 "^| level" "$RUN/baselines.md" | head -12; grep -A16 "^## Results" "$RUN"/*/eval/report.md
  ;;
accounting)  # the activations' speedups and baselines with the code at TREE (default: this one), as NAME.json
  mkdir -p /tmp/accounting
  PYTHONPATH="${3:-$PWD}" python3 scripts/bench_accounting.py --kernelbench "$KB" --out "/tmp/accounting/${2:?NAME}.json" 2>&1 | grep -v Warning | tail -18
  cp "/tmp/accounting/$2.json" "$OUT/"
  ;;
tasks-check)  # which KernelBench problems need transformed verification sets, and any no transform fixes [SECONDS per level]
  for level in level1 level2 level3; do  # a level per command: one cut short by the call's limit loses only itself
    timeout "${2:-600}" python3 -m launch.cli tasks check --backend cuda --sets-only --jsonl "$KB/$level" > "$OUT/tasks-check-$level.jsonl"
  done
  python3 - "$OUT"/tasks-check-level*.jsonl <<'PY'
import json, sys
rows = [json.loads(line) for path in sys.argv[1:] for line in open(path) if line.startswith("{")]
extra = [r for r in rows if r["verification_sets"]]
trivial = [r for r in rows if any("trivial kernel" in p for p in r["problems"])]
print(f"{len(rows)} problems; {len(extra)} need transformed sets; {len(trivial)} no transform fixes")
for r in extra: print("  needs", "+".join(r["verification_sets"]), r["task_id"])
for r in trivial: print("  NOT FIXED", r["task_id"], [p for p in r["problems"] if "trivial" in p])
PY
  ;;
baselines-start)  # STAGE (compile, time or all) on CPUS (taskset's list) and GPUS (torch's indices, default all)
  mkdir -p "$BASE"
  setsid nohup taskset -c "${3:?CPUS}" python3 scripts/kernelbench_baselines.py --out "$BASE" --stage "${2:?STAGE}" \
    ${4:+--gpus "$4"} --tasks "$KB/level1" "$KB/level2" "$KB/level3" --timing "$KB/results/timing/H100_Modal" \
    > "$BASE/$2.log" 2>&1 < /dev/null &
  sleep 5; tail -3 "$BASE/$2.log"
  ;;
baselines-wait)
  end=$(( $(date +%s) + ${2:?seconds} ))
  while [ "$(date +%s)" -lt "$end" ] && pgrep -f kernelbench_baselines.py > /dev/null; do
    # device memory as it goes (whose, and how much): what a burst of out-of-memory failures had beside it
    { date +%T; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; } >> "$BASE/memory.log" 2>&1
    sleep 10
  done
  echo "compiled: $(cat "$BASE"/compiled.jsonl 2>/dev/null | grep -c '"ok": true'); baselines: $(cat "$BASE"/baselines-gpu*.jsonl 2>/dev/null | grep -c eager_ms); failed: $(cat "$BASE"/baselines-gpu*.jsonl 2>/dev/null | grep -c '"error"'); running: $(pgrep -f kernelbench_baselines.py > /dev/null && echo yes || echo no)"
  ;;
baselines-report)
  python3 scripts/kernelbench_baselines.py --out "$BASE" --stage compare --tasks "$KB/level1" "$KB/level2" "$KB/level3" \
    --timing "$KB/results/timing/H100_Modal" | tail -12
  cat "$BASE"/baselines-gpu*.jsonl > "$OUT/baselines.jsonl"; cp "$BASE/baselines.md" "$BASE/baselines.json" "$BASE/compiled.jsonl" "$BASE/memory.log" "$OUT/" 2>/dev/null
  tail -c 3000 "$BASE"/worker-gpu0.log > "$OUT/worker-gpu0.log" 2>/dev/null; true
  ;;
esac
