#!/usr/bin/env bash
# The main job: set up (or reuse) .venv, then train LaplacianFormer-tiny Mask R-CNN and evaluate COCO
# bbox/segm AP. Uses data/coco when it exists, otherwise the bundled synthetic COCO-format set with a
# short CPU schedule (120 iterations of batch 2 per epoch, several seconds each on 2 cores). Environment:
# CONFIG, WORK_DIR, EPOCHS (toy schedule length, default 2), EXTRA_OPTIONS (more --cfg-options for
# both training and testing, e.g. "train_dataloader.batch_size=4").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CONFIG="${CONFIG:-configs/mask_rcnn_laplacian_tiny_1x_coco.py}"
NAME="$(basename "$CONFIG" .py)"
bash tools/setup_env.sh
PY=.venv/bin/python
if [ -d data/coco ]; then
  WORK_DIR="${WORK_DIR:-work_dirs/$NAME}"
  echo "[demo] data/coco found: training $CONFIG on COCO (full schedule) in $WORK_DIR"
  DATA_ARGS=()
  "$PY" tools/train.py "$CONFIG" --work-dir "$WORK_DIR" ${EXTRA_OPTIONS:+--cfg-options $EXTRA_OPTIONS}
else
  WORK_DIR="${WORK_DIR:-work_dirs/${NAME}_toy}"
  EPOCHS="${EPOCHS:-2}"
  echo "[demo] data/coco not found: using the bundled synthetic COCO-format set (data/toy/coco),"
  echo "[demo] $EPOCHS epochs on the CPU, in $WORK_DIR"
  "$PY" tools/make_toy_data.py --out data/toy --what coco
  DATA_ARGS=(--toy-data)
  "$PY" tools/train.py "$CONFIG" --work-dir "$WORK_DIR" --toy-data --cfg-options \
    train_cfg.max_epochs="$EPOCHS" train_cfg.val_interval="$EPOCHS" \
    "param_scheduler.1.milestones=[$((EPOCHS > 1 ? EPOCHS - 1 : EPOCHS))]" param_scheduler.1.end="$EPOCHS" \
    param_scheduler.0.end=50 \
    optim_wrapper.optimizer.lr=2e-4 default_hooks.logger.interval=10 \
    default_hooks.checkpoint.interval="$EPOCHS" \
    train_dataloader.num_workers=1 val_dataloader.num_workers=1 test_dataloader.num_workers=1 \
    ${EXTRA_OPTIONS:-}
fi
CHECKPOINT="$(cat "$WORK_DIR/last_checkpoint")"
echo "[demo] evaluating $CHECKPOINT"
"$PY" tools/test.py "$CONFIG" "$CHECKPOINT" --work-dir "$WORK_DIR" "${DATA_ARGS[@]}" \
  --out-json "$WORK_DIR/metrics.json" ${EXTRA_OPTIONS:+--cfg-options $EXTRA_OPTIONS}
