#!/usr/bin/env bash
# Op check on a CUDA machine, in under 15 minutes: build the extension with its CUDA kernels if it
# lacks them (FORCE_CUDA=1, TORCH_CUDA_ARCH_LIST = this GPU unless set), run every
# tests/test_ops_*.py (CUDA-marked tests included), the fast compile/export tests and the CUDA
# torch.compile tests of the backbones (tests/test_compile_export.py), the op benchmark on the
# GPU, and print a summary. On a machine without a GPU it runs the CPU parts and says which CUDA
# parts it skipped. Logs and the benchmark JSON go to $GPU_CHECK_OUT (default: $OUT if set, else
# benchmark_results/). Exit status: 0 when everything that ran passed.
#
#   bash tools/gpu_check.sh
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
OUT_DIR="${GPU_CHECK_OUT:-${OUT:-$ROOT/benchmark_results}}"
mkdir -p "$OUT_DIR"
status=0
started=$SECONDS

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
    if timeout 280 "$PY" setup.py build_ext --inplace > "$OUT_DIR/gpu_check_build.log" 2>&1 \
        && has_cuda_kernels; then
      build_line="built with CUDA in $((SECONDS - t0)) s"
    else
      build_line="FAILED (see $OUT_DIR/gpu_check_build.log)"
      tail -30 "$OUT_DIR/gpu_check_build.log"
      status=1
    fi
  fi
fi
extension_line="$("$PY" -c 'from mmlinattn.ops import extension_status; print(extension_status())' 2>&1 | tail -1)"

# --- tests -------------------------------------------------------------------------------------
run_tests() {  # $1: timeout s, $2: log name, then pytest arguments; prints pytest's last line
  local limit=$1 log=$2
  shift 2
  timeout "$limit" "$PY" -m pytest "$@" -q -rfEs -p no:cacheprovider > "$OUT_DIR/$log" 2>&1
  local rc=$?
  if [ $rc -eq 124 ]; then echo "timed out after $limit s (log: $OUT_DIR/$log)"; else tail -1 "$OUT_DIR/$log"; fi
  return $rc
}
echo "== op tests (CPU, and CUDA when present) =="
op_tests="$(run_tests 300 gpu_check_tests_ops.log tests/test_ops_*.py -m 'not slow')" || status=1
echo "$op_tests"
echo "== compile / export tests (fast tier, and the CUDA compiles when present) =="
compile_tests="$(run_tests 360 gpu_check_tests_compile.log tests/test_compile_export.py \
  -m 'cuda or not slow')" || status=1
echo "$compile_tests"
grep -E '^(FAILED|ERROR)' "$OUT_DIR"/gpu_check_tests_*.log 2>/dev/null | head -20

# --- benchmark ---------------------------------------------------------------------------------
if [ -n "$gpu" ]; then
  echo "== op benchmark (CUDA) =="
  t0=$SECONDS
  if timeout 120 "$PY" tools/benchmark.py ops --device cuda --repeats 20 \
      --out "$OUT_DIR/ops_cuda.json" 2>&1 | tee "$OUT_DIR/gpu_check_benchmark.log"; then
    bench_line="done in $((SECONDS - t0)) s: $OUT_DIR/ops_cuda.json"
  else
    bench_line="FAILED (see $OUT_DIR/gpu_check_benchmark.log)"
    status=1
  fi
else
  bench_line="skipped (no CUDA device; the CPU op benchmark is \`python tools/benchmark.py ops\`)"
fi

echo
echo "== gpu_check summary ($((SECONDS - started)) s) =="
echo "device     : $device_line"
echo "build      : $build_line"
echo "extension  : $extension_line"
echo "op tests   : $op_tests"
echo "compile    : $compile_tests"
echo "benchmark  : $bench_line"
echo "logs       : $OUT_DIR/gpu_check_*.log"
if [ $status -eq 0 ]; then echo "result     : OK"; else echo "result     : FAILED"; fi
exit $status
