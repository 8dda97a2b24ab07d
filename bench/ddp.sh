#!/usr/bin/env bash
# DDP at world size 2: dtrain (`dtrain bench ddp`) next to PyTorch's own DDP
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
  # One intra-op thread per rank, as dtrain's ranks get.
  OMP_NUM_THREADS=1 "$venv/bin/torchrun" --standalone --nproc-per-node 2 bench/peers/ddp_peer.py \
    --model "$model" "$@" --json "$RESULTS/ddp-$model-pytorch-np2.json"
  files+=("$RESULTS/ddp-$model-dtrain-np2.json" "$RESULTS/ddp-$model-pytorch-np2.json")
done
echo
"$venv/bin/python" bench/ddp_compare.py --json "$RESULTS/ddp-np2.json" "${files[@]}"
