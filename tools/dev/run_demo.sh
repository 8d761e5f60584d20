#!/usr/bin/env bash
# The main job: set up (or reuse) .venv, then train LaplacianFormer-Tiny Mask R-CNN and report COCO
# bbox/segm AP.
#
# With data/coco: the config's full schedule on COCO (tools/train.py), then tools/test.py.
# Without it, the real workflow in miniature on the bundled synthetic sets (data/toy, ~11 min on
# 2 CPU cores):
#   1. pretrain LaplacianFormer-T as a classifier on toy-ImageNet (configs/toy/laplacianformer_tiny_toy_imagenet.py),
#   2. fine-tune Mask R-CNN (configs/toy/mask_rcnn_laplacian_tiny_toy_coco.py, i.e. the 1x config's
#      model) on toy-COCO, its backbone loaded from that classifier through init_cfg=Pretrained,
#   3. evaluate with mmdet's CocoMetric and draw the predictions (tools/test.py --show-dir),
#   4. plot the loss/accuracy/AP curves and print a one-screen summary (tools/dev/demo_report.py).
#
# Environment:
#   PY               an interpreter that already has the environment: skips tools/dev/setup_env.sh
#   WORK_DIR         output folder (default work_dirs/toy_demo, or work_dirs/<config> on COCO)
#   CONFIG           the COCO config (default configs/mask_rcnn_laplacian_tiny_1x_coco.py)
#   EXTRA_OPTIONS    COCO: more --cfg-options for training and testing
#   PRETRAIN_OPTIONS toy: more --cfg-options for the pretraining, e.g. "train_cfg.max_epochs=3"
#   FINETUNE_OPTIONS toy: more --cfg-options for the fine-tuning and its test, e.g. "train_cfg.max_epochs=1
#                    train_dataloader.dataset.indices=60 val_dataloader.dataset.indices=6 test_dataloader.dataset.indices=6"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
if [ -z "${PY:-}" ]; then
  bash tools/dev/setup_env.sh
  PY=.venv/bin/python
fi

if [ -d data/coco ]; then
  read -r -a EXTRA <<< "${EXTRA_OPTIONS:-}"
  CONFIG="${CONFIG:-configs/mask_rcnn_laplacian_tiny_1x_coco.py}"
  WORK_DIR="${WORK_DIR:-work_dirs/$(basename "$CONFIG" .py)}"
  echo "[demo] data/coco found: training $CONFIG on COCO in $WORK_DIR"
  "$PY" tools/dev/demo_report.py schedule "$CONFIG" ${EXTRA_OPTIONS:+--cfg-options "${EXTRA[@]}"}
  "$PY" tools/train.py "$CONFIG" --work-dir "$WORK_DIR" ${EXTRA_OPTIONS:+--cfg-options "${EXTRA[@]}"}
  "$PY" tools/test.py "$CONFIG" "$(cat "$WORK_DIR/last_checkpoint")" --work-dir "$WORK_DIR" \
    --out-json "$WORK_DIR/metrics.json" ${EXTRA_OPTIONS:+--cfg-options "${EXTRA[@]}"}
  exit 0
fi

WORK_DIR="${WORK_DIR:-work_dirs/toy_demo}"
PRETRAIN_CONFIG=configs/toy/laplacianformer_tiny_toy_imagenet.py
FINETUNE_CONFIG=configs/toy/mask_rcnn_laplacian_tiny_toy_coco.py
read -r -a PRETRAIN_EXTRA <<< "${PRETRAIN_OPTIONS:-}"
read -r -a FINETUNE_EXTRA <<< "${FINETUNE_OPTIONS:-}"
mkdir -p "$WORK_DIR"
STAGES="$WORK_DIR/stage_seconds.txt"
: > "$STAGES"
stage() {  # stage NAME CMD...: run CMD, append "NAME SECONDS" to $STAGES
  local name="$1" start=$SECONDS
  shift
  echo "[demo] $name"
  "$@"
  echo "$name $((SECONDS - start))" >> "$STAGES"
}

echo "[demo] data/coco not found: the workflow in miniature on the bundled synthetic sets, in $WORK_DIR"
stage toy-data "$PY" tools/dev/make_toy_data.py --out data/toy --what coco imagenet
stage pretrain "$PY" tools/train.py "$PRETRAIN_CONFIG" --toy-data --work-dir "$WORK_DIR/pretrain" \
  ${PRETRAIN_OPTIONS:+--cfg-options "${PRETRAIN_EXTRA[@]}"}
CLASSIFIER="$(cat "$WORK_DIR/pretrain/last_checkpoint")"
stage finetune "$PY" tools/train.py "$FINETUNE_CONFIG" --toy-data --work-dir "$WORK_DIR/finetune" \
  --cfg-options "model.backbone.init_cfg.checkpoint=$CLASSIFIER" "${FINETUNE_EXTRA[@]}"
DETECTOR="$(cat "$WORK_DIR/finetune/last_checkpoint")"
rm -rf "$WORK_DIR/predictions"
stage test "$PY" tools/test.py "$FINETUNE_CONFIG" "$DETECTOR" --toy-data --work-dir "$WORK_DIR/test" \
  --out-json "$WORK_DIR/metrics.json" --show-dir "$WORK_DIR/predictions" \
  --cfg-options "model.backbone.init_cfg.checkpoint=$CLASSIFIER" "${FINETUNE_EXTRA[@]}"
"$PY" tools/dev/demo_report.py report "$WORK_DIR"
