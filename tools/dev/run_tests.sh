#!/usr/bin/env bash
# The test command: set up (or reuse) .venv, build the extension (with CUDA code: FORCE_CUDA=1, so that
# the kernels keep compiling on machines without a GPU), generate the toy data, run the test suite.
# Without arguments both tiers run, the fast one first (`-m "not slow"`: ops, layers, backbones, the
# config walk, the tools' options), then the slow one (`-m slow`: end-to-end training runs, distributed
# runs, export and figure runs); it stops after a failing tier. Each tier runs in TEST_WORKERS
# pytest-xdist workers (default 2, the CI machine's cores; 0 = in the pytest process), each with its
# share of the cores as OpenMP threads (OMP_NUM_THREADS, which the tests pass on to their training,
# export and onnxruntime subprocesses): workers whose threads outnumber the cores spin-wait for each
# other (docs/development.md). The fast tier keeps a test file on one
# worker (its module fixtures start once); the slow tier spreads single tests and keeps each
# `xdist_group` together. Arguments go to pytest instead, e.g.
# `bash tools/dev/run_tests.sh -m "not slow"` for the fast tier alone, in one process. Each tier ends
# with its slowest tests (--durations): where CI's time goes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export FORCE_CUDA="${FORCE_CUDA:-1}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-8.0;9.0}"
bash tools/dev/setup_env.sh
.venv/bin/python tools/dev/make_toy_data.py --out data/toy
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -ra "$@"
fi
workers="${TEST_WORKERS:-2}"
threads=$(( $(nproc) / (workers > 1 ? workers : 1) ))
export OMP_NUM_THREADS=$(( threads > 1 ? threads : 1 ))
start=$SECONDS
.venv/bin/python -m pytest -ra -m "not slow" -n "$workers" --dist loadfile --durations=10
echo "[run_tests] tier -m \"not slow\" passed in $((SECONDS - start)) s ($workers workers, $OMP_NUM_THREADS threads each)"
start=$SECONDS
.venv/bin/python -m pytest -ra -m slow -n "$workers" --dist loadgroup --durations=25
echo "[run_tests] tier -m slow passed in $((SECONDS - start)) s ($workers workers, $OMP_NUM_THREADS threads each)"
