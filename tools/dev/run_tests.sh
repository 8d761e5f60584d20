#!/usr/bin/env bash
# The test command: set up (or reuse) .venv, build the extension (with CUDA code: FORCE_CUDA=1, so that
# the kernels keep compiling on machines without a GPU), generate the toy data, run the test suite.
# Without arguments both tiers run, the fast one first (`-m "not slow"`: ops, layers, backbones, the
# config walk, the tools' options), then the slow one (`-m slow`: end-to-end training runs, distributed
# runs, export and figure runs); it stops after a failing tier. Each tier runs in TEST_WORKERS
# pytest-xdist processes (default 2, the CI machine's cores; 1 = one process): the fast tier keeps a
# test file on one worker (its module fixtures start once), the slow tier spreads single tests and
# keeps each `xdist_group` together. Arguments go to pytest instead, e.g.
# `bash tools/dev/run_tests.sh -m "not slow"` for the fast tier alone, in one process.
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
for tier in "not slow" "slow"; do
  if [ "$tier" = "slow" ]; then dist=loadgroup; else dist=loadfile; fi
  start=$SECONDS
  .venv/bin/python -m pytest -ra -m "$tier" -n "$workers" --dist "$dist"
  echo "[run_tests] tier -m \"$tier\" passed in $((SECONDS - start)) s ($workers workers)"
done
