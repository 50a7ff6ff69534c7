#!/usr/bin/env bash
# The GPU figures of the closing notes, in parts that each fit one 10-minute device call, on a
# machine with two GPUs (nvidia-h200-x2) after the gpu-stack activation:
#   . .gpu-stack/bin/activate && bash scripts/gpu_figures.sh 1   # weight-sync tests, swap s/GB
#   . .gpu-stack/bin/activate && bash scripts/gpu_figures.sh 2   # agent-loop overhead, colocated run (CUDA IPC)
#   . .gpu-stack/bin/activate && bash scripts/gpu_figures.sh 3   # two-GPU run (NCCL), async against sync
#   . .gpu-stack/bin/activate && bash scripts/gpu_figures.sh 4   # one GPU: folder swap test, packed-row budget (sdpa)
# Results go to $OUT (or ./gpu-figures); each part ends with a short table.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-$PWD/gpu-figures}"
mkdir -p "$OUT"
MODEL=/tmp/random-0.5b
[ -f "$MODEL/config.json" ] || python3 -m tests.tiny_model "$MODEL" --shape 0.5b > /dev/null 2>&1
# A short agentic stage: a random model never calls a tool, so episodes end after
# rollout.max_turns_without_call turns, each up to max_new_tokens (end-of-turn comes at random).
TRAIN=(model.path=$MODEL stage.name=agentic_ppo stage.steps=5 stage.batch_episodes=16 rollout.episodes_in_flight=16
       rollout.max_turns=4 rollout.max_new_tokens=1024 rollout.min_new_tokens=64 rollout.max_context_tokens=16384
       logging.progress=false)

case "${1:?part 1, 2, 3 or 4}" in
1)
  python3 -m pytest --run-gpu --run-slow -m gpu -p no:cacheprovider -q tests/test_gpu_weight_sync.py \
    tests/test_episode.py 2>&1 | tail -5
  python3 scripts/bench_weight_sync.py --shape 0.5b --out "$OUT/weight_sync.json" 2>&1 | tail -5
  ;;
2)
  python3 scripts/bench_agent_loop.py --shape smollm2-shape --raw-eos --streams 64 --turns 8 --tokens 512 \
    --out "$OUT/agent_loop.json" 2>&1 | tail -30
  started=$(date +%s)
  timeout 420 python3 -m launch.cli train gpu-1xh100 "${TRAIN[@]}" cluster.num_gpus=1 \
    logging.out_dir="$OUT/colocated" > "$OUT/colocated.log" 2>&1
  echo "colocated (1 GPU, CUDA IPC) train: rc=$? in $(( $(date +%s) - started )) s"
  python3 - "$OUT/colocated/metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    print(f"step {r['step']}: step_s {r['step_s']:.1f} swap_s {r.get('sync/swap_s', 0):.3f} "
          f"tokens {r.get('learner/tokens')} reward {r.get('reward/mean')} staleness {r.get('buffer/staleness_mean')}")
EOF
  ;;
3)
  timeout 590 python3 scripts/bench_train.py gpu-2xh200 "${TRAIN[@]}" --out "$OUT/train_2gpu.json" \
    > "$OUT/train_2gpu.log" 2>&1
  echo "rc=$?"; tail -12 "$OUT/train_2gpu.log"
  ;;
4)
  python3 -m pytest --run-gpu -m gpu -p no:cacheprovider -q tests/test_gpu_weight_sync.py 2>&1 | tail -3
  # PPO steps on 16 segments packed into 16k-token rows (sdpa under a block-diagonal mask)
  # against rows of at most 1k tokens: why learner.cpu_micro_batch_tokens caps CPU rows only.
  for len in 2048 512; do
    for rows in 16384 1024; do
      python3 scripts/bench_learner.py --model random-0.5b --seqs 16 --seq-len $len --micro-batch-tokens $rows \
        --steps 2 --out "$OUT/rows_${len}_${rows}.json" > "$OUT/rows_${len}_${rows}.log" 2>&1
      echo "seq_len $len micro_batch_tokens $rows: $(tail -1 "$OUT/rows_${len}_${rows}.json" 2>/dev/null || tail -3 "$OUT/rows_${len}_${rows}.log")"
    done
  done
  ;;
esac
