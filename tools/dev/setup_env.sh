#!/usr/bin/env bash
# Set up (or reuse) the project's virtual environment at .venv/ and install mmlinattn into it.
#
# Idempotent: each step is skipped when its result is already there. The mmcv wheel (a ~15 min build
# on 2 cores) and the compiled extension are cached outside the repo under $MMLINATTN_CACHE
# (default ~/.cache/mmlinattn) and reused by later runs and fresh clones.
#
# Usage: bash tools/dev/setup_env.sh            (then: source .venv/bin/activate)
# Env:   MMLINATTN_CACHE  cache folder; FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="8.0;9.0" to compile CUDA code
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${MMLINATTN_CACHE:-$HOME/.cache/mmlinattn}"
VENV="$ROOT/.venv"
LOGS="$CACHE/logs"
PY_BOOT="${PYTHON:-python3.11}"
mkdir -p "$CACHE/wheels" "$LOGS"

TORCH_VERSION=2.14.1
TORCHVISION_VERSION=0.29.1
MMCV_VERSION=2.1.0
SETUPTOOLS_SPEC='setuptools>=77,<82'

step() { printf '\n[setup] %s\n' "$*"; }

# run NAME CMD...: run a step with its output in a log; on failure say which step and where the log is.
run() {
  local name="$1"; shift
  local log="$LOGS/${name}.log"
  local rc=0
  "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "[setup] FAILED: step '$name' (exit code $rc). Log: $log" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
}

if ! command -v "$PY_BOOT" >/dev/null 2>&1; then
  echo "[setup] FAILED: $PY_BOOT not found; Python 3.11 is required (mmengine/mmcv break on 3.12+)." >&2
  exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
  step "creating virtual environment at .venv/ ($($PY_BOOT --version))"
  run venv "$PY_BOOT" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)

have() { "$PY" - "$@" <<'PYEOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
for spec in sys.argv[1:]:
    name, want = spec.split('==')
    assert version(name) == want, (name, version(name), want)
PYEOF
}

if ! have "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"; then
  step "installing build tools, torch $TORCH_VERSION and torchvision $TORCHVISION_VERSION"
  run pip-tools "${PIP[@]}" install -U "pip<26" "$SETUPTOOLS_SPEC" wheel ninja
  run torch "${PIP[@]}" install "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
fi

if ! have "mmengine==0.10.7"; then
  step "installing mmengine and build/runtime dependencies"
  run mmengine "${PIP[@]}" install "$SETUPTOOLS_SPEC" "mmengine==0.10.7" "numpy<2" "opencv-python<4.11" \
    pycocotools ftfy regex matplotlib scipy terminaltables
fi

# pytest 9.2 silently undoes xdist 3.8's --dist loadgroup (pytest-xdist#1386): every worker would
# repeat the module fixtures of the slow tier's xdist groups (tests/test_test_tiers.py)
if ! have "pytest==9.1.1" "pytest-xdist==3.8.0"; then
  step "installing pytest and pytest-xdist (the test tiers run on every core)"
  run pytest "${PIP[@]}" install "pytest==9.1.1" "pytest-xdist==3.8.0"
fi

if ! have "mmcv==$MMCV_VERSION"; then
  PYTAG="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
  MMCV_DEVICE="$("$PY" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')"
  WHEEL_DIR="$CACHE/wheels/mmcv-$MMCV_VERSION-torch$TORCH_VERSION-$PYTAG-$MMCV_DEVICE"
  if ! ls "$WHEEL_DIR"/mmcv-*.whl >/dev/null 2>&1; then
    step "building mmcv $MMCV_VERSION with ops from its sdist (about 15 min on 2 cores; cached in $WHEEL_DIR)"
    SRC="$CACHE/src"
    rm -rf "$SRC" && mkdir -p "$SRC"
    run mmcv-download "${PIP[@]}" download --no-deps --no-binary :all: --no-build-isolation -d "$SRC" "mmcv==$MMCV_VERSION"
    tar -xzf "$SRC"/mmcv-*.tar.gz -C "$SRC"
    MMCV_SRC="$(ls -d "$SRC"/mmcv-$MMCV_VERSION)"
    # torch 2.14 headers require C++20; mmcv 2.1.0 hard-codes c++14/c++17 for both gcc and nvcc.
    sed -i -E 's/-std=c\+\+1[47]/-std=c++20/g' "$MMCV_SRC/setup.py"
    grep -q 'c++20' "$MMCV_SRC/setup.py" || { echo "[setup] FAILED: C++20 patch did not apply to mmcv setup.py" >&2; exit 1; }
    mkdir -p "$WHEEL_DIR.tmp"
    # FORCE_CUDA is for our extension; mmcv builds its CUDA ops only where a GPU is visible.
    # pip builds in the source tree: one line a minute with the objects compiled so far / total.
    bash "$ROOT/tools/dev/build_progress.sh" "$MMCV_SRC/build" $$ 60 "mmcv build" &
    PROGRESS_PID=$!
    run mmcv-build env -u FORCE_CUDA MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-2}" \
      "${PIP[@]}" wheel --no-build-isolation --no-deps -w "$WHEEL_DIR.tmp" "$MMCV_SRC"
    kill "$PROGRESS_PID" 2>/dev/null || true
    rm -rf "$WHEEL_DIR" && mv "$WHEEL_DIR.tmp" "$WHEEL_DIR"
    rm -rf "$SRC"
  else
    step "reusing cached mmcv wheel from $WHEEL_DIR"
  fi
  run mmcv-install "${PIP[@]}" install "$WHEEL_DIR"/mmcv-*.whl
fi

if ! have "mmdet==3.3.0" "mmsegmentation==1.2.2" "mmpretrain==1.2.0"; then
  step "installing mmdet 3.3.0, mmsegmentation 1.2.2, mmpretrain 1.2.0"
  run openmmlab "${PIP[@]}" install "$SETUPTOOLS_SPEC" "numpy<2" "opencv-python<4.11" \
    "mmdet==3.3.0" "mmsegmentation==1.2.2" "mmpretrain==1.2.0" onnx onnxruntime onnxscript
fi

# mmdeploy 1.3.1 (tools/deploy.py, tools/deploy_test.py): its wheel pins protobuf<=3.20.2, which onnx
# (>= 1.15) cannot use, so it goes in without its pins, beside the few of its requirements the
# onnxruntime path imports (docs/deployment.md). onnx and onnxruntime came with the OpenMMLab step.
if ! have "mmdeploy==1.3.1"; then
  step "installing mmdeploy 1.3.1 (without its protobuf pin) and what its onnxruntime path imports"
  run mmdeploy "${PIP[@]}" install --no-deps "mmdeploy==1.3.1"
  run mmdeploy-deps "${PIP[@]}" install aenum multiprocess prettytable terminaltables
fi

# onnxruntime's pip wheel has no C/C++ API headers; Debian's libonnxruntime-dev package has them
# (MIT, API version 21: the op library built against them loads into onnxruntime >= 1.21). Fetched
# once into the cache and checked; without them the extension is built without the op library.
ORT_HEADERS_VERSION=1.21.0+dfsg-1
ORT_HEADERS_SHA256=14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08
ORT_HEADERS_URL="http://deb.debian.org/debian/pool/main/o/onnxruntime/libonnxruntime-dev_${ORT_HEADERS_VERSION}_amd64.deb"
ORT_HEADERS="$CACHE/onnxruntime-headers-$ORT_HEADERS_VERSION"
if [ -z "${ONNXRUNTIME_INCLUDE_DIR:-}" ] && [ ! -f "$ORT_HEADERS/onnxruntime_cxx_api.h" ]; then
  step "fetching onnxruntime's API headers ($ORT_HEADERS_URL)"
  DEB="$CACHE/libonnxruntime-dev.deb"
  if curl -fsSL --retry 2 -o "$DEB" "$ORT_HEADERS_URL" && echo "$ORT_HEADERS_SHA256  $DEB" | sha256sum -c --quiet; then
    EXTRACT="$(mktemp -d)"
    (cd "$EXTRACT" && ar x "$DEB" && tar -xf data.tar.* ./usr/include/onnxruntime)
    rm -rf "$ORT_HEADERS" && mv "$EXTRACT/usr/include/onnxruntime" "$ORT_HEADERS"
    rm -rf "$EXTRACT" "$DEB"
  else
    echo "[setup] WARNING: could not fetch onnxruntime's headers; building without the onnxruntime op library" >&2
    rm -f "$DEB"
  fi
fi
if [ -z "${ONNXRUNTIME_INCLUDE_DIR:-}" ] && [ -f "$ORT_HEADERS/onnxruntime_cxx_api.h" ]; then
  export ONNXRUNTIME_INCLUDE_DIR="$ORT_HEADERS"
fi

# The extension is cached by a hash of its sources, setup.py, the torch version and the CUDA settings,
# so a fresh clone with unchanged ops reuses the build (CUDA code takes minutes to compile).
WITH_CUDA=0
if [ "${FORCE_CUDA:-0}" = "1" ] || "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  WITH_CUDA=1
  export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
  NV_INCLUDE="$("$PY" -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cu13", "include"))' 2>/dev/null || true)"
  [ -d "$NV_INCLUDE" ] && export CPATH="$NV_INCLUDE${CPATH:+:$CPATH}"
fi
EXT_KEY="$( (cd "$ROOT" && find ops/csrc ops/onnxruntime -type f | LC_ALL=C sort | xargs sha256sum; sha256sum setup.py;
             echo "torch=$TORCH_VERSION cuda=$WITH_CUDA arch=${TORCH_CUDA_ARCH_LIST:-} ort=${ONNXRUNTIME_INCLUDE_DIR:+$ORT_HEADERS_VERSION}") | sha256sum | cut -c1-16)"
EXT_CACHE="$CACHE/ext/$EXT_KEY"
rm -f "$ROOT"/mmlinattn/_ext*.so "$ROOT"/mmlinattn/libmmlinattn_onnxruntime_ops.so
if ls "$EXT_CACHE"/_ext*.so >/dev/null 2>&1; then
  step "reusing the cached build of mmlinattn._ext ($EXT_KEY, CUDA kernels: $WITH_CUDA)"
else
  step "compiling mmlinattn._ext (CUDA kernels: $WITH_CUDA${TORCH_CUDA_ARCH_LIST:+, archs $TORCH_CUDA_ARCH_LIST})${ONNXRUNTIME_INCLUDE_DIR:+ and the onnxruntime op library}"
  (cd "$ROOT" && MAX_JOBS="${MAX_JOBS:-2}" run extension "$PY" setup.py build_ext --inplace)
  mkdir -p "$EXT_CACHE.tmp" && cp "$ROOT"/mmlinattn/_ext*.so "$EXT_CACHE.tmp"/
  if [ -n "${ONNXRUNTIME_INCLUDE_DIR:-}" ]; then
    cp "$ROOT"/mmlinattn/libmmlinattn_onnxruntime_ops.so "$EXT_CACHE.tmp"/
  fi
  rm -rf "$EXT_CACHE" && mv "$EXT_CACHE.tmp" "$EXT_CACHE"
fi
cp "$EXT_CACHE"/*.so "$ROOT"/mmlinattn/

if ! "$PY" -m pip show -f mmlinattn 2>/dev/null | grep -q "$ROOT"; then
  step "installing mmlinattn (editable)"
  MMLINATTN_SKIP_EXT=1 run mmlinattn "${PIP[@]}" install --no-build-isolation --no-deps -e "$ROOT"
fi
# mmengine's read_base() looks for `mmlinattn.configs.<name>` under the distribution's location joined
# with the package name (get_installed_path): site-packages/mmlinattn, which a PEP 660 editable install
# does not create. The link makes `from mmlinattn.configs.<name> import *` work in .venv as in a wheel.
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
ln -sfn "$ROOT/mmlinattn" "$SITE/mmlinattn"

run import-check "$PY" -c "import mmcv.ops, mmdet, mmseg, mmpretrain, mmlinattn"
step "ready: $("$PY" -c 'import torch, mmcv, mmdet, mmseg, mmpretrain, mmlinattn; print(f"torch {torch.__version__}, mmcv {mmcv.__version__}, mmdet {mmdet.__version__}, mmseg {mmseg.__version__}, mmpretrain {mmpretrain.__version__}, mmlinattn {mmlinattn.__version__} (extension: {mmlinattn.ops.extension_status()})")')"
