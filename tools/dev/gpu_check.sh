#!/usr/bin/env bash
# Op check on a CUDA machine within one time budget: build the extension with its CUDA kernels if it
# lacks them (FORCE_CUDA=1, TORCH_CUDA_ARCH_LIST = this GPU unless set), run the ops' self-test
# (python -m mmlinattn.ops.selftest: every implementation against the fp64 reference), every
# tests/test_ops_*.py (CUDA-marked tests included), the op benchmarks on the GPU (Triton against
# the C++ kernels, the reference and the PyTorch baselines: what decides each op's default,
# dispatch.CUDA_DEFAULT), the backbone benchmark (ours against mmdet's PVT-T and Swin-T at 224^2,
# 512^2 and 1024^2, fp32 and AMP), then the fast compile/export tests and the CUDA torch.compile
# tests (the Triton operators, the backbones with the Triton and the C++ kernels;
# tests/test_compile_export.py), and print a summary. Each step's timeout is cut to what the
# budget has left (GPU_CHECK_BUDGET_S, default 540 s: one device command may run 600 s); a step cut
# off still reports the tests it passed. On a machine without a GPU it runs the CPU parts and says
# which CUDA parts it skipped.
# Logs and the benchmark JSON go to $GPU_CHECK_OUT (default: $OUT if set, else benchmark_results/).
# Exit status: 0 when everything that ran passed.
#
#   bash tools/dev/gpu_check.sh                # here: .venv's python; elsewhere $PYTHON or python3
#   bash tools/dev/gpu_check.sh --bundle-deps  # copy the pure-Python packages the tests import that
#                                              # a bare CUDA image lacks (mmengine, mmcv without its
#                                              # compiled ops, ...) into .gpu_deps/ (git-ignored), to
#                                              # travel with the tree; the check puts them on
#                                              # PYTHONPATH (GPU_CHECK_DEPS: another folder)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
else PY=python3; fi
DEPS_DIR="${GPU_CHECK_DEPS:-$ROOT/.gpu_deps}"
# what mmlinattn and its tests import beyond torch, numpy, pyyaml, rich and opencv
BUNDLED_PACKAGES=(mmengine mmcv addict yapf yapf_third_party termcolor)

if [ "${1:-}" = "--bundle-deps" ]; then
  rm -rf "$DEPS_DIR" && mkdir -p "$DEPS_DIR"
  for name in "${BUNDLED_PACKAGES[@]}"; do
    src="$("$PY" -c "import importlib.util, os, sys
spec = importlib.util.find_spec(sys.argv[1])
print(os.path.dirname(spec.origin) if spec and spec.origin else '')" "$name")"
    if [ -z "$src" ]; then echo "--bundle-deps: $name is not importable with $PY" >&2; exit 2; fi
    # mmcv's compiled ops are built for this machine's torch: left out (mmcv.cnn does not load them)
    tar -C "$(dirname "$src")" --exclude='*.so' --exclude='__pycache__' -cf - "$(basename "$src")" \
      | tar -C "$DEPS_DIR" -xf -
  done
  echo "bundled ${BUNDLED_PACKAGES[*]} into $DEPS_DIR ($(du -sh "$DEPS_DIR" | cut -f1))"
  exit 0
fi
# the tree itself (the package need not be installed) and the bundle, when there is one
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if [ -d "$DEPS_DIR" ]; then export PYTHONPATH="$DEPS_DIR:$PYTHONPATH"; fi

OUT_DIR="${GPU_CHECK_OUT:-${OUT:-$ROOT/benchmark_results}}"
mkdir -p "$OUT_DIR"
BUDGET_S="${GPU_CHECK_BUDGET_S:-540}"
status=0
started=$SECONDS

step_limit() {  # $1: the step's own cap in s, $2: s kept for the steps after it; prints the timeout
  local left=$((BUDGET_S - (SECONDS - started) - $2))
  if [ "$left" -lt "$1" ]; then echo $((left > 10 ? left : 10)); else echo "$1"; fi
}

gpu="$("$PY" -c 'import torch
if torch.cuda.is_available():
    major, minor = torch.cuda.get_device_capability()
    print(f"{torch.cuda.get_device_name()}|{major}.{minor}")' 2>/dev/null)"

has_cuda_kernels() {
  "$PY" -c 'import sys
from mmlinattn.ops.dispatch import has_kernel
sys.exit(0 if has_kernel("laplacian_kernel", "cuda") else 1)' 2>/dev/null
}

# --- build -------------------------------------------------------------------------------------
if [ -z "$gpu" ]; then
  device_line="none: CPU only (CUDA build, CUDA tests and the CUDA benchmark are skipped)"
  build_line="skipped (no CUDA device)"
else
  device_line="${gpu%|*} (compute capability ${gpu#*|})"
  if has_cuda_kernels; then
    build_line="reused the built extension (it has CUDA kernels)"
  else
    export FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-${gpu#*|}}"
    export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
    if [ -z "${CUDA_HOME:-}" ] && [ -d /usr/local/cuda ]; then export CUDA_HOME=/usr/local/cuda; fi
    wheel_headers="$("$PY" -c 'import os, sysconfig
print(os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "cu13", "include"))')"
    if [ -d "$wheel_headers" ]; then export CPATH="$wheel_headers${CPATH:+:$CPATH}"; fi
    t0=$SECONDS
    echo "== building mmlinattn._ext with CUDA (arch $TORCH_CUDA_ARCH_LIST) =="
    if timeout "$(step_limit 240 300)" "$PY" setup.py build_ext --inplace \
        > "$OUT_DIR/gpu_check_build.log" 2>&1 && has_cuda_kernels; then
      build_line="built with CUDA in $((SECONDS - t0)) s"
    else
      build_line="FAILED (see $OUT_DIR/gpu_check_build.log)"
      tail -30 "$OUT_DIR/gpu_check_build.log"
      status=1
    fi
  fi
fi
extension_line="$("$PY" -c 'from mmlinattn.ops import extension_status; print(extension_status())' 2>&1 | tail -1)"

# --- self-test: every implementation on this device against the fp64 reference -----------------
if [ -n "$gpu" ]; then selftest_args=(--device cuda); else selftest_args=(--device cpu --quick); fi
echo "== self-test (python -m mmlinattn.ops.selftest ${selftest_args[*]}) =="
if timeout "$(step_limit 90 420)" "$PY" -m mmlinattn.ops.selftest "${selftest_args[@]}" \
    > "$OUT_DIR/gpu_check_selftest.log" 2>&1; then
  selftest_line="all PASS ($OUT_DIR/gpu_check_selftest.log)"
else
  selftest_line="FAILED or timed out ($OUT_DIR/gpu_check_selftest.log)"
  status=1
fi
cat "$OUT_DIR/gpu_check_selftest.log"

# --- tests and benchmark -------------------------------------------------------------------------
PROGRESS_FAILURE='::[^ ]+ (FAILED|ERROR)'  # pytest -v's line of a failed test, as it runs
run_tests() {  # $1: timeout s, $2: log name, then pytest arguments; prints pytest's last line
  local limit=$1 log=$2
  shift 2
  timeout "$limit" "$PY" -m pytest "$@" -v -rfEs -p no:cacheprovider > "$OUT_DIR/$log" 2>&1
  local rc=$?
  if [ $rc -eq 124 ]; then
    echo "timed out after $limit s: $(grep -c ' PASSED' "$OUT_DIR/$log") passed," \
      "$(grep -cE "$PROGRESS_FAILURE" "$OUT_DIR/$log") failed before it (log: $OUT_DIR/$log)"
  else
    tail -1 "$OUT_DIR/$log"
  fi
  return $rc
}
echo "== op tests (CPU, and CUDA when present) =="
op_tests="$(run_tests "$(step_limit 150 270)" gpu_check_tests_ops.log tests/test_ops_*.py \
  -m 'not slow')" || status=1
echo "$op_tests"

if [ -n "$gpu" ]; then
  echo "== op benchmark (CUDA) =="
  t0=$SECONDS
  if timeout "$(step_limit 100 180)" "$PY" tools/benchmark.py ops --device cuda --repeats 20 \
      --out "$OUT_DIR/ops_cuda.json" 2>&1 | tee "$OUT_DIR/gpu_check_benchmark.log"; then
    bench_line="done in $((SECONDS - t0)) s: $OUT_DIR/ops_cuda.json"
  else
    bench_line="FAILED or timed out (see $OUT_DIR/gpu_check_benchmark.log)"
    status=1
  fi
  echo "== backbone benchmark (CUDA, fp32 and AMP) =="
  backbone_models=(LaplacianFormer-T Pola-PVT-T Pola-Swin-T)
  if "$PY" -c 'import mmdet.models.backbones' > /dev/null 2>&1; then
    backbone_models+=("PVT-T (mmdet)" "Swin-T (mmdet)")
    backbone_note=""
  else
    backbone_note=" (mmdet not importable: PVT-T and Swin-T left out)"
  fi
  t0=$SECONDS
  backbone_line="done in %d s: $OUT_DIR/backbones_cuda*.json$backbone_note"
  for precision in fp32 amp; do
    amp_flag=(); json="$OUT_DIR/backbones_cuda.json"
    if [ "$precision" = amp ]; then amp_flag=(--amp); json="$OUT_DIR/backbones_cuda_amp.json"; fi
    if ! timeout "$(step_limit 60 120)" "$PY" tools/benchmark.py backbone --device cuda \
        --sizes '224^2' '512^2' '1024^2' --models "${backbone_models[@]}" --repeats 5 \
        "${amp_flag[@]}" --out "$json" 2>&1 | tee -a "$OUT_DIR/gpu_check_benchmark.log"; then
      backbone_line="FAILED or timed out in $precision (see $OUT_DIR/gpu_check_benchmark.log)"
      status=1
    fi
  done
  backbone_line="$(printf "$backbone_line" $((SECONDS - t0)))"
else
  bench_line="skipped (no CUDA device; the CPU op benchmark is \`python tools/benchmark.py ops\`)"
  backbone_line="skipped (no CUDA device)"
fi

# last: the inductor compiles take what the budget has left
echo "== compile / export tests (fast tier, and the CUDA compiles when present) =="
compile_tests="$(run_tests "$(step_limit 600 0)" gpu_check_tests_compile.log \
  tests/test_compile_export.py -m 'cuda or not slow')" || status=1
echo "$compile_tests"
# each failed test once: from pytest's summary (with its message), or as it ran in a log cut off
for log in "$OUT_DIR"/gpu_check_tests_*.log; do
  if grep -q 'short test summary info' "$log"; then grep -E '^(FAILED|ERROR) ' "$log"
  else grep -E "$PROGRESS_FAILURE" "$log"; fi
done | head -20

echo
echo "== gpu_check summary ($((SECONDS - started)) s) =="
echo "device     : $device_line"
echo "build      : $build_line"
echo "extension  : $extension_line"
echo "self-test  : $selftest_line"
echo "op tests   : $op_tests"
echo "compile    : $compile_tests"
echo "benchmark  : $bench_line"
echo "backbones  : $backbone_line"
if [ -n "$gpu" ]; then  # the lines of the implementations benchmark that decide the defaults
  grep -o 'decides: .*' "$OUT_DIR/gpu_check_benchmark.log" | sed 's/^/default    : /'
fi
echo "logs       : $OUT_DIR/gpu_check_*.log"
if [ $status -eq 0 ]; then echo "result     : OK"; else echo "result     : FAILED"; fi
exit $status
