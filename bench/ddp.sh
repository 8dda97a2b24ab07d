#!/usr/bin/env bash
# DDP at world size 2: dtrain (`dtrain bench ddp`, and for the MLP also a
# `dtrain train` run of the same workload) next to PyTorch's own DDP
# (bench/peers/ddp_peer.py under torchrun), in one command.
#
#   bench/ddp.sh [--steps N] [--rounds N] [--warmup N]    (passed to both sides)
#
# For each model the two sides run back to back, so each comparison is taken
# minutes apart at most; both print their tables, then bench/ddp_compare.py
# prints the combined one. JSON goes to bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
RESULTS=bench/results

# shellcheck source=bench/torch_venv.sh
source bench/torch_venv.sh  # $venv: the pinned torch wheel's virtual environment

mkdir -p "$RESULTS"
files=()
for model in mlp gpt; do
  "$BUILD/bin/dtrain" bench ddp --nproc 2 --model "$model" "$@" --json "$RESULTS/ddp-$model-dtrain-np2.json"
  if [[ $model == mlp ]]; then
    # The same model, per-rank batch and optimizer through the whole trainer
    # (`dtrain train`: data loading, the schedule, logging, the non-finite
    # check), right after the engine alone: the difference is the trainer's.
    "$BUILD/bin/dtrain" train --model mlp --mlp-hidden 2048,2048 --strategy ddp --nproc 2 --batch-size 16 \
      --optimizer sgd --lr 1e-3 --momentum 0 --weight-decay 0 --steps 200 --log-every 50 \
      --metrics "$RESULTS/ddp-mlp-train-np2.jsonl"
    files+=(--train "$RESULTS/ddp-mlp-train-np2.jsonl")
  fi
  # One intra-op thread per rank, as dtrain's ranks get.
  OMP_NUM_THREADS=1 "$venv/bin/torchrun" --standalone --nproc-per-node 2 bench/peers/ddp_peer.py \
    --model "$model" "$@" --json "$RESULTS/ddp-$model-pytorch-np2.json"
  files+=("$RESULTS/ddp-$model-dtrain-np2.json" "$RESULTS/ddp-$model-pytorch-np2.json")
done
echo
"$venv/bin/python" bench/ddp_compare.py --json "$RESULTS/ddp-np2.json" "${files[@]}"
