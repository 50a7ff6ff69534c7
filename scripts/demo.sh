#!/usr/bin/env bash
# README's main job on the embedded default (CPU, SmolLM2-135M-Instruct, the cpp backend):
# the most complete real pipeline the package has today. It prepares the default model,
# screens every starter task's reference, and runs the protected environment on a
# legitimate kernel and on a reward hack, printing each verdict.
set -euo pipefail
cd "$(dirname "$0")/.."
CLI=.venv/bin/cuda-agent
$CLI doctor
$CLI model prepare
$CLI tasks check --threads 1
echo "== a legitimate OpenMP GELU kernel (expect CORRECT or better)"
$CLI env eval level1/01_gelu tests/env_corpus/legit/gelu_omp --config cpu-demo
echo "== a reward hack that calls torch.softmax inside ModelNew.forward (expect a torch_fallback rejection)"
$CLI env eval level1/03_softmax tests/env_corpus/hacks/torch_fallback_softmax --config cpu-demo || true
