#!/usr/bin/env bash
# Report the progress of a setuptools/torch extension build while it runs (tools/dev/setup_env.sh uses
# it for the ~15 min mmcv build): every INTERVAL seconds one line with the objects compiled so far under
# BUILD_DIR and, once torch has written its build.ninja there, the total.
#
# Usage: bash tools/dev/build_progress.sh BUILD_DIR WATCH_PID [INTERVAL=60] [LABEL=build]
# Runs until WATCH_PID exits (or it is killed), so a failed set-up leaves no reporter behind.
set -uo pipefail
BUILD_DIR="$1"
WATCH_PID="$2"
INTERVAL="${3:-60}"
LABEL="${4:-build}"
START=$SECONDS
NEXT=$((START + INTERVAL))

report() {
  local compiled total ninja
  compiled="$(find "$BUILD_DIR" -name '*.o' 2>/dev/null | wc -l)"
  ninja="$(find "$BUILD_DIR" -name build.ninja 2>/dev/null | head -n 1)"
  total=""
  if [ -n "$ninja" ]; then
    total="$(grep -c '^build .*\.o:' "$ninja" 2>/dev/null || true)"
  fi
  local elapsed=$(((SECONDS - START) / 60))
  if [ -n "$total" ] && [ "$total" -gt 0 ]; then
    echo "[setup] $LABEL: $compiled/$total objects compiled (${elapsed} min)"
  elif [ "$compiled" -gt 0 ]; then
    echo "[setup] $LABEL: $compiled objects compiled (${elapsed} min)"
  else
    echo "[setup] $LABEL: preparing the sources (${elapsed} min)"
  fi
}

while kill -0 "$WATCH_PID" 2>/dev/null; do
  sleep 1
  if [ "$SECONDS" -ge "$NEXT" ]; then
    report
    NEXT=$((NEXT + INTERVAL))
  fi
done
