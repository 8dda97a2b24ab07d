#!/usr/bin/env bash
# FSDP: `dtrain bench fsdp` (memory scaling against `dtrain plan`, then step
# time of full sharding vs DDP at world size 2), then PyTorch's FSDP2 on the
# same speed workload (bench/peers/fsdp_peer.py under torchrun), then the two
# side by side (bench/fsdp_compare.py). About 4-5 minutes on 2 cores.
#
#   bench/fsdp.sh [dtrain bench fsdp options]      e.g. --world-sizes 1,2,4 --rounds 11
#
# JSON goes to bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
RESULTS=bench/results

# shellcheck source=bench/torch_venv.sh
source bench/torch_venv.sh  # $venv: the pinned torch wheel's virtual environment

# The peer follows the same protocol: --rounds, when given, goes to it too.
peer_args=()
args=("$@")
for i in "${!args[@]}"; do
  [[ ${args[$i]} == --rounds ]] && peer_args=(--rounds "${args[$((i + 1))]}")
done

mkdir -p "$RESULTS"
"$BUILD/bin/dtrain" bench fsdp "$@" --json "$RESULTS/fsdp-dtrain.json"
# One intra-op thread per rank, as dtrain's ranks get.
OMP_NUM_THREADS=1 "$venv/bin/torchrun" --standalone --nproc-per-node 2 bench/peers/fsdp_peer.py \
  "${peer_args[@]}" --json "$RESULTS/fsdp-gpt-pytorch-np2.json"
"$venv/bin/python" bench/fsdp_compare.py "$RESULTS/fsdp-dtrain.json" "$RESULTS/fsdp-gpt-pytorch-np2.json" \
  --json "$RESULTS/fsdp-np2-compare.json"
