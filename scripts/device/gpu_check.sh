#!/usr/bin/env bash
# Builds dtrain on a bare GPU machine against its python3's torch, runs the
# CUDA tests, then `dtrain train` on CUDA and the GPU benchmark (issue 23;
# scripts/device/gpu_runs.sh). Run from anywhere in the repository, with
# .devkit/ beside it (made here by scripts/device/make_kit.sh: OpenMPI,
# GoogleTest, nlohmann-json, CLI11, zlib headers, none of which that machine
# has).
#
#   scripts/device/gpu_check.sh [all|configure|build|test|runs]   (default: all)
#
# test: the CUDA tests, at 1 rank (NCCL) and test_cuda_training at 2 and 3
# ranks sharing the GPU (DTRAIN_CUDA_BACKEND=gloo); runs: gpu_runs.sh's
# phases (dtrain train end to end, the benchmark, the largest model).
# Logs go to $OUT (default build-gpu/out), 6 files (the device tool brings
# back at most 8):
#   gpu_check.log    everything below, as it happens
#   build.log        the full ninja output
#   bench.txt        the plain-LibTorch baseline runs (bench_gpt_cuda output)
#   gpu_results.md   the results page (bench/gpu_report.py): tests, end-to-end
#                    runs, throughput, overlap, largest model
#   gpu_runs.tar.gz  $WORK: every run's metrics/log/trace summary, the plans,
#                    the gtest XML reports (one per program and rank)
#   summary.txt      the one-line verdict (also the log's last line)
# Settings (environment): TORCH_PREFIX (default: python3's
# torch.utils.cmake_prefix_path), BUILD_DIR (default build-gpu), JOBS
# (default: all cores), CUDA_ARCH (default 9.0), GPU_TEST_RANKS (default
# "2 3": test_cuda_training's runs through Gloo), DTRAIN_GPU_BENCH=0 to skip
# the plain-LibTorch baseline runs, DEADLINE (default 560): seconds the whole script may
# take; each step gets at most what is left and is skipped (NO-TIME-LEFT in
# the summary) without its minimum (the device tool kills a command at 600
# s); BUILD_LIMIT (default 480) caps the build step alone; gpu_runs.sh's own
# (GPU_RUNS_PHASES, ...) are listed there.
set -uo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
mode=${1:-all}
OUT=${OUT:-$repo/build-gpu/out}
BUILD_DIR=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-$(nproc)}
CUDA_ARCH=${CUDA_ARCH:-9.0}
DEADLINE=${DEADLINE:-560}
KIT=$repo/.devkit
# The dtrain train runs and the results page: functions, run by the test/runs steps.
. "$repo/scripts/device/gpu_runs.sh"
export CPLUS_INCLUDE_PATH="$KIT/gloo-include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
tee_pid=$!

started=$SECONDS
status_line=()
. "$repo/scripts/device/step_budget.sh"
finish() {
  local line="gpu_check: ${status_line[*]:-nothing ran} (${BUILD_DIR}, $((SECONDS - started))s)"
  echo "$line" >"$OUT/summary.txt"
  gpu_runs_finish  # the results page and the tarball (they show the summary too)
  echo
  echo "$line"
  exec >&- 2>&-       # end tee's input, so it can finish writing
  wait "$tee_pid" 2>/dev/null || true
}
trap finish EXIT

if [ ! -d "$KIT/root/usr" ]; then
  echo "no $KIT/root: run scripts/device/make_kit.sh here and carry .devkit"
  note "NO-KIT"
  exit 2
fi

# --- the machine ---------------------------------------------------------
step "machine"
uname -a; (. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"); nproc
command -v nvidia-smi >/dev/null && nvidia-smi || echo "no nvidia-smi"
PYTHON=${PYTHON:-$(command -v python3)}
echo "python3: $PYTHON"
if [ -z "${TORCH_PREFIX:-}" ]; then
  TORCH_PREFIX=$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)' | tail -n 1) || {
    note "NO-TORCH"; exit 2; }
fi
"$PYTHON" - <<'EOF' || true
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None,
      "cxx11abi", torch.compiled_with_cxx11_abi())
if torch.cuda.is_available():
    print(torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
EOF
echo "TORCH_PREFIX=$TORCH_PREFIX"

# Note [filesystem symbols from LibTorch] (src/common/file_tree.h): what the
# wheel exports of libstdc++'s <filesystem>, and whether remove_all works
# when it binds to that copy (as in dtrain) next to the machine's own.
step "std::filesystem in the torch wheel"
torch_lib=$(cd "$TORCH_PREFIX/../../lib" 2>/dev/null && pwd)
if [ -n "$torch_lib" ] && [ -f "$torch_lib/libtorch_cpu.so" ]; then
  for lib in libtorch.so libtorch_cpu.so libtorch_cuda.so; do
    [ -f "$torch_lib/$lib" ] &&
      echo "$lib exports $(nm -D --defined-only "$torch_lib/$lib" | c++filt | grep -c 'std::filesystem') std::filesystem symbols"
  done
  nm -D --defined-only "$torch_lib/libtorch_cpu.so" | c++filt | grep -E 'std::filesystem::remove_all' | head -n 4
  probe_dir=$(mktemp -d)
  # with-libtorch-cpu: that library alone; with-libtorch: LibTorch's libraries in
  # the order dtrain's link names them (libtorch.so, which exports a copy of
  # its own, first). On 2026-12-04 the first passed and the second died of
  # SIGSEGV, as every resumed dtrain run had.
  torch_libs=()
  for lib in torch torch_cpu torch_cuda c10_cuda c10; do [ -f "$torch_lib/lib$lib.so" ] && torch_libs+=("-l$lib"); done
  for kind in plain with-libtorch-cpu with-libtorch; do
    flags=()
    [ "$kind" = with-libtorch-cpu ] && flags=(-Wl,--no-as-needed -L"$torch_lib" -ltorch_cpu -Wl,-rpath,"$torch_lib")
    [ "$kind" = with-libtorch ] && flags=(-Wl,--no-as-needed -L"$torch_lib" "${torch_libs[@]}" -Wl,-rpath,"$torch_lib")
    if c++ -std=c++17 -O1 scripts/device/filesystem_probe.cpp -o "$probe_dir/probe-$kind" "${flags[@]}"; then
      (cd "$probe_dir" && timeout 20 "./probe-$kind")
      rc=$?
      echo "filesystem probe ($kind): exit $rc"
      note "fs-probe-$kind=$([ "$rc" = 0 ] && echo OK || echo "FAIL($rc)")"
    fi
  done
  rm -rf "$probe_dir"
fi

# nvcc: LibTorch's CMake config enables the CUDA language.
NVCC=${NVCC:-$(command -v nvcc || true)}
for candidate in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
  [ -n "$NVCC" ] && break
  [ -x "$candidate" ] && NVCC=$candidate
done
if [ -z "$NVCC" ]; then echo "no nvcc found"; note "NO-NVCC"; exit 2; fi
CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
export PATH="$(dirname "$NVCC"):$PATH" CUDA_HOME="$CUDA_ROOT" CUDA_PATH="$CUDA_ROOT"
"$NVCC" --version | tail -n 2
echo "CUDA root: $CUDA_ROOT"
# The venv holds cmake and ninja where the system has none.
export PATH="$PATH:$(dirname "$PYTHON")"
{ c++ --version || g++ --version; } | head -n 1; cmake --version | head -n 1
if command -v ninja >/dev/null; then
  generator=Ninja keep_going="-k 0"
  echo "ninja $(ninja --version)"
else
  generator="Unix Makefiles" keep_going="-k"
  echo "no ninja: using make"
fi

# --- the kit ---------------------------------------------------------------
kit_lib=$KIT/root/usr/lib/x86_64-linux-gnu
ld_path=$kit_lib
for pair in udev:libudev.so.1 z:libz.so.1; do
  # (grep reads from a file, not a pipe: under pipefail grep -q's early exit could fail ldconfig with SIGPIPE.)
  if ! grep -q "${pair#*:} " <(ldconfig -p 2>/dev/null); then
    echo "this machine has no ${pair#*:}: using the kit's copy"
    ld_path=$ld_path:$KIT/fallback/${pair%%:*}
  fi
done
# libmpi's own dependencies (libopen-rte, hwloc, libevent) are found through
# this at link time (ld searches it for DT_NEEDED) and at run time.
export LD_LIBRARY_PATH=$ld_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# zlib: headers from the kit where the system has none; the system's library.
zlib_lib=$(ldconfig -p 2>/dev/null | awk '/libz\.so\.1 .*x86-64/ {print $NF; exit}')
[ -n "$zlib_lib" ] || zlib_lib=$KIT/fallback/z/libz.so.1
zlib_inc=/usr/include
[ -f /usr/include/zlib.h ] || zlib_inc=$KIT/root/usr/include
ompi=$kit_lib/openmpi

configure() {
  step "configure $BUILD_DIR"
  # FindMPI takes the library names, libraries and include directories as
  # given and skips looking for an mpicxx wrapper (the machine has none);
  # the SKIP/ASSUME switches only matter if a CMake version looks anyway
  # (CMake reports them as unused otherwise).
  timeout "$(budget 120)" cmake -S . -B "$BUILD_DIR" -G "$generator" \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$KIT/root/usr" \
    -DTORCH_CUDA_ARCH_LIST="$CUDA_ARCH" \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DCUDAToolkit_ROOT="$CUDA_ROOT" \
    -DPython3_EXECUTABLE="$PYTHON" \
    -DMPI_SKIP_COMPILER_WRAPPER=ON -DMPI_ASSUME_NO_BUILTIN_MPI=ON \
    -DMPI_CXX_COMPILER="$kit_lib/no-mpicxx" \
    -DMPI_CXX_LIB_NAMES="mpi_cxx;mpi" \
    -DMPI_mpi_LIBRARY="$ompi/lib/libmpi.so" -DMPI_mpi_cxx_LIBRARY="$ompi/lib/libmpi_cxx.so" \
    -DMPI_CXX_HEADER_DIR="$ompi/include" \
    -DMPI_CXX_ADDITIONAL_INCLUDE_DIRS="$ompi/include/openmpi" \
    -DMPI_CXX_COMPILER_INCLUDE_DIRS="$ompi/include;$ompi/include/openmpi" \
    -DGTest_DIR="$kit_lib/cmake/GTest" \
    -Dnlohmann_json_DIR="$KIT/root/usr/share/cmake/nlohmann_json" \
    -DCLI11_DIR="$KIT/root/usr/share/cmake/CLI11" \
    -DZLIB_INCLUDE_DIR="$zlib_inc" -DZLIB_LIBRARY="$zlib_lib" \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$kit_lib" \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
    ${EXTRA_CMAKE_ARGS:-}
}

targets=(dtrain_cli test_cuda_collectives test_cuda_training)
[ "${DTRAIN_GPU_BENCH:-1}" != 0 ] && targets+=(bench_gpt_cuda)

build() {
  step "build ${targets[*]} (-j$JOBS)"
  # Keep going: every compile error in one go, not just the first.
  timeout "$(budget "${BUILD_LIMIT:-480}")" cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}" -- $keep_going 2>&1 |
    tee "$OUT/build.log" |
    grep -E "error|warning: .*deprecated|FAILED|^ninja: " | awk 'NR <= 200'  # reads to the end: no SIGPIPE for tee
  local rc=${PIPESTATUS[0]}
  tail -n 5 "$OUT/build.log"
  return "$rc"
}

# Each test program under the launcher through c10d: run_test NAME NPROC LIMIT.
# One rank: cuda:0, NCCL. More: ranks sharing the one GPU through Gloo.
run_test() {
  local name=$1 nproc=$2 limit=$3
  shift 3
  local label=$name envs=(DTRAIN_TIMEOUT=60 "NCCL_DEBUG=${NCCL_DEBUG:-WARN}") command
  [ "$nproc" -gt 1 ] && label=$name@$nproc
  step "test $label"
  if [ ! "$BUILD_DIR/bin/$name" -nt "$BUILD_DIR/.gpu_check_build_started" ]; then
    echo "$name was not built by this run"
    note "$label=NOT-BUILT"
    return 0
  fi
  if [ "$(budget 20)" -lt 20 ]; then note "$label=NO-TIME-LEFT"; return 0; fi
  if [ "$nproc" = 1 ]; then
    command=("$BUILD_DIR/bin/$name" --gtest_output="xml:$WORK/$name.xml" "$@")
  else
    envs+=(DTRAIN_CUDA_BACKEND=gloo)
    command=(/bin/sh scripts/device/rank_xml.sh "$WORK/$name-np$nproc" "$BUILD_DIR/bin/$name" "$@")
  fi
  env "${envs[@]}" timeout -k 5 "$(budget "$limit")" \
    "$BUILD_DIR/bin/dtrain" launch -n "$nproc" --backend c10d -- "${command[@]}"
  local rc=$?
  # 77: every case skipped (no GPU; the CPU dry run of tests/long/check_gpu_kit.sh).
  if [ "$rc" = 0 ]; then note "$label=PASS"; elif [ "$rc" = 77 ]; then note "$label=SKIPPED"; else note "$label=FAIL($rc)"; fi
  # A program whose every case skipped passes too: say so.
  local reports=("$WORK/$name.xml")
  [ "$nproc" = 1 ] || reports=("$WORK/$name-np$nproc"-rank*.xml)
  local cases skipped
  cases=$(cat "${reports[@]}" 2>/dev/null | grep -c '<testcase')
  skipped=$(cat "${reports[@]}" 2>/dev/null | grep -c 'result="skipped"')
  if [ "$cases" -gt 0 ] && [ "$skipped" = "$cases" ]; then note "($label: ALL $cases cases SKIPPED)"
  elif [ "$skipped" -gt 0 ]; then note "($label has $skipped SKIPPED cases)"; fi
  return 0
}

if [ "$mode" = all ] || [ "$mode" = configure ]; then
  if configure; then note "configure=OK"; else note "configure=FAIL"; exit 1; fi
  grep -E "^(MPI_CXX_LIB_NAMES|MPI_mpi_LIBRARY|MPI_mpi_cxx_LIBRARY|MPI_CXX_HEADER_DIR|GTest_DIR|nlohmann_json_DIR|CLI11_DIR|ZLIB_INCLUDE_DIR|ZLIB_LIBRARY|Torch_DIR|CMAKE_CUDA_COMPILER):" \
    "$BUILD_DIR/CMakeCache.txt"
fi
if [ "$mode" = all ] || [ "$mode" = build ]; then
  touch "$BUILD_DIR/.gpu_check_build_started"
  sleep 1  # binaries built from here on are newer than the marker
  # On failure go on: the programs that did link still run.
  if build; then note "build=OK"; else note "build=FAIL"; fi
fi
if [ "$mode" = all ] || [ "$mode" = test ]; then
  [ -f "$BUILD_DIR/.gpu_check_build_started" ] || touch -d @0 "$BUILD_DIR/.gpu_check_build_started"
  work_init
  step "libraries a test program loads"
  ldd "$BUILD_DIR/bin/test_cuda_collectives" | grep -E "mpi|open-|hwloc|event|torch_cuda|nccl|cudart|not found"
  run_test test_cuda_collectives 1 120
  run_test test_cuda_training 1 240
  # GPU_TEST_RANKS: the rank counts test_cuda_training also runs at (Gloo).
  for ranks in ${GPU_TEST_RANKS:-2 3}; do run_test test_cuda_training "$ranks" 120; done
fi
if [ "$mode" = all ] || [ "$mode" = runs ]; then
  [ -f "$BUILD_DIR/.gpu_check_build_started" ] || touch -d @0 "$BUILD_DIR/.gpu_check_build_started"
  gpu_runs_main
fi
