# shellcheck shell=bash
# Sourced by bench/ddp.sh and bench/fsdp.sh, from the repository root with
# BUILD set: the pinned torch wheel's virtual environment (scripts/setup) in
# $venv, found from the LibTorch prefix the build recorded:
# <venv>/lib/python3.X/site-packages/torch/share/cmake.
torch_prefix=$(cat "$BUILD/.torch-prefix")
venv=${torch_prefix%%/lib/python*}
[[ -x "$venv/bin/torchrun" ]] || { echo "bench/${0##*/}: no torchrun in $venv/bin (run make build)" >&2; exit 1; }
# The wheel's venv has no NumPy; torch warns about that once per rank.
export PYTHONWARNINGS="ignore:Failed to initialize NumPy"
