#!/usr/bin/env bash
# Distributed training with torchrun: bash tools/dist_train.sh CONFIG NUM_PROCS [train.py args...]
# Multi-node: NNODES, NODE_RANK, MASTER_ADDR, PORT as environment variables.
CONFIG=$1
NPROCS=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
DIR="$(cd "$(dirname "$0")" && pwd)"
PYTHON=${PYTHON:-python}
exec "$PYTHON" -m torch.distributed.run --nnodes="$NNODES" --node_rank="$NODE_RANK" \
  --master_addr="$MASTER_ADDR" --nproc_per_node="$NPROCS" --master_port="$PORT" \
  "$DIR/train.py" "$CONFIG" --launcher pytorch "${@:3}"
