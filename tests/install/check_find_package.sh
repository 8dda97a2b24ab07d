#!/usr/bin/env bash
# Installs dtrain from BUILD_DIR into a scratch prefix, builds a separate
# project against it with find_package(dtrain), and runs that on 2 ranks.
# Usage: check_find_package.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
source_dir="$2"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
cmake -S "$source_dir/tests/install/consumer" -B "$scratch/build" \
  -DCMAKE_PREFIX_PATH="$scratch/prefix;$(cat "$build/.torch-prefix")" >"$scratch/configure.log" ||
  { cat "$scratch/configure.log"; exit 1; }
cmake --build "$scratch/build" -j 2 >"$scratch/build.log" || { cat "$scratch/build.log"; exit 1; }
status=0
output="$("$scratch/prefix/bin/dtrain" launch -n 2 -- "$scratch/build/consumer" 2>&1)" || status=$?
echo "$output"
[[ $status -eq 0 ]] || { echo "check_find_package: the consumer job exited with $status" >&2; exit 1; }
[[ "$output" == *"consumer: world 2 sum 3"* ]] || { echo "check_find_package: wrong or missing result" >&2; exit 1; }
