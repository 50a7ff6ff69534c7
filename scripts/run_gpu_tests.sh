#!/usr/bin/env bash
# Every gpu-marked test in one call, on a GPU machine: the slow ones too (a load_inline CUDA
# build is ~60 s there). Run it after the gpu-stack activation (see ../shared/gpu-stack/README.md):
#   . .gpu-stack/bin/activate && bash scripts/run_gpu_tests.sh
# The GPU machines have torch, vLLM, Ray and DeepSpeed but not this package installed:
# the tests run from the source tree.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -m pytest --run-gpu --run-slow -m gpu -p no:cacheprovider -q "$@"
