#!/usr/bin/env bash
# Every gpu-marked test, on a GPU machine: the slow ones too (a load_inline CUDA build is ~60 s
# there). Run it after the gpu-stack activation (see ../shared/gpu-stack/README.md):
#   . .gpu-stack/bin/activate && bash scripts/run_gpu_tests.sh [PYTEST ARGS, e.g. a test file]
# The GPU machines have torch, vLLM, Ray and DeepSpeed but not this package installed: the tests
# run from the source tree. They lack datasketch and pytest-asyncio: carry them as wheels in the
# ignored .whl/ (the device README's pip download) and this installs them into /tmp/gpu-tests-site.
# All of them take longer than one 10-minute device call: give a file or two per call. Each test's
# verdict is a line of $OUT/gpu-tests.log (or ./gpu-figures/) as it ends, so a call cut short
# keeps what ran.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import datasketch, pytest_asyncio" 2> /dev/null; then
  wheels=(.whl/datasketch-*.whl .whl/pytest_asyncio-*.whl)
  [ -f "${wheels[0]}" ] && [ -f "${wheels[1]}" ] || {
    echo "datasketch and pytest-asyncio are missing here: put their wheels in .whl/ and carry it" >&2; exit 2; }
  python3 -m pip install -q --no-index --no-deps --target /tmp/gpu-tests-site "${wheels[@]}" 2>&1 | grep -v WARNING || true
  export PYTHONPATH="/tmp/gpu-tests-site:$PYTHONPATH"
fi
log="${OUT:-$PWD/gpu-figures}/gpu-tests.log"
mkdir -p "$(dirname "$log")"
python3 -m pytest --run-gpu --run-slow -m gpu -p no:cacheprovider -v -rfEsx "$@" 2>&1 | tee -a "$log"
exit "${PIPESTATUS[0]}"
