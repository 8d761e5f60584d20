#!/usr/bin/env bash
# The test command: set up (or reuse) .venv, build the extension (with CUDA code: FORCE_CUDA=1, so that
# the kernels keep compiling on machines without a GPU), generate the toy data, run the test suite.
# Extra arguments go to pytest, e.g. `bash tools/run_tests.sh -m slow` for the long end-to-end runs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export FORCE_CUDA="${FORCE_CUDA:-1}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-8.0;9.0}"
bash tools/setup_env.sh
.venv/bin/python tools/make_toy_data.py --out data/toy
if [ "$#" -eq 0 ]; then
  set -- -m "not slow"
fi
exec .venv/bin/python -m pytest -ra "$@"
