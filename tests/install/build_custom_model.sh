#!/usr/bin/env bash
# Installs dtrain from BUILD_DIR into OUT/prefix and builds examples/custom_model
# (a separate CMake project: find_package(dtrain), dtrain::cli) into OUT/build,
# for the custom_model.* tests, which run OUT/build/custom_model.
# Usage: build_custom_model.sh BUILD_DIR SOURCE_DIR OUT
set -euo pipefail
build="$1"
source_dir="$2"
out="$3"
rm -rf "$out"
mkdir -p "$out"
cmake --install "$build" --prefix "$out/prefix" >"$out/install.log" || { cat "$out/install.log"; exit 1; }
cmake -S "$source_dir/examples/custom_model" -B "$out/build" \
  -DCMAKE_PREFIX_PATH="$out/prefix;$(cat "$build/.torch-prefix")" >"$out/configure.log" 2>&1 ||
  { cat "$out/configure.log"; exit 1; }
cmake --build "$out/build" -j 2 >"$out/build.log" 2>&1 || { cat "$out/build.log"; exit 1; }
# Its main is dtrain's: the registry lists the example's model next to the built-ins.
help="$("$out/build/custom_model" train --help)"
[[ "$help" == *"resnet: a residual CNN with BatchNorm"* ]] ||
  { echo "build_custom_model: custom_model train --help does not list --model resnet" >&2; exit 1; }
echo "build_custom_model: built $out/build/custom_model against the install in $out/prefix"
