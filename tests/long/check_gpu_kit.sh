#!/usr/bin/env bash
# make check-long: the GPU check kit, dry, on this machine (issue 36, item 3).
# A GPU is lent for minutes now and then; the kit must build and run when it
# is, so it is exercised here first:
#  1. scripts/device/make_kit.sh makes .devkit/ from scripts/setup's own
#     package list (scripts/debian_packages.sh);
#  2. scripts/device/gpu_check.sh configures and builds the kit's targets in
#     $KIT_BUILD against the kit, as on the GPU machine (the CUDA toolkit's
#     nvcc here, LibTorch from scripts/setup);
#  3. its CUDA tests run (each case SKIPPED without a GPU) and every phase of
#     scripts/device/gpu_runs.sh runs with DTRAIN_GPU_DEVICE=cpu at toy
#     sizes, through the same scripts and the same results page.
# Fails if a step fails or the summary line names a failed run. About 25
# minutes on 2 cores, most of it the build. Needs the Debian package
# registry (apt-get download) and the CUDA toolkit (else prints SKIP).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
KIT_BUILD=${KIT_BUILD:-build-kit}
if ! command -v nvcc >/dev/null && ! compgen -G "/usr/local/cuda*/bin/nvcc" >/dev/null; then
  echo "check_gpu_kit: SKIP: no CUDA toolkit (nvcc) on this machine"
  exit 0
fi
bash scripts/device/make_kit.sh
out=$KIT_BUILD/out
rm -rf "$out"
TORCH_PREFIX=$(cat "$BUILD/.torch-prefix") BUILD_DIR=$KIT_BUILD OUT=$out DTRAIN_GPU_DEVICE=cpu \
  DEADLINE=${KIT_DEADLINE:-5400} BUILD_LIMIT=${KIT_BUILD_LIMIT:-3600} GPU_TEST_RANKS=2 \
  bash scripts/device/gpu_check.sh all || true
summary=$(cat "$out/summary.txt")
echo "check_gpu_kit: $summary"
for expected in configure=OK build=OK; do
  grep -q "$expected" <<<"$summary" || { echo "check_gpu_kit: FAIL: no $expected"; exit 1; }
done
if grep -qE "FAIL|TIMEOUT|NO-FINAL|NOT-BUILT|NO-TIME-LEFT|NO-KIT" <<<"$summary"; then
  echo "check_gpu_kit: FAIL: the summary names a run that did not succeed (details: $out/gpu_check.log)"
  exit 1
fi
echo "check_gpu_kit: PASS"
