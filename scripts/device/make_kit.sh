#!/usr/bin/env bash
# Builds .devkit/: the Debian 12 development packages dtrain needs and a bare
# GPU machine lacks (scripts/debian_packages.sh's libraries: OpenMPI, xxHash,
# SentencePiece, GoogleTest, nlohmann-json, CLI11, zlib and Gloo headers),
# unpacked (dpkg -x, no install) so that scripts/device/gpu_check.sh can point
# CMake at them there. Run here, from anywhere in the repository; needs
# apt-get (for `apt-get download`) and network, no root.
#
# What goes in (and why so little):
#   root/            the packages' files, docs and man pages dropped
#     the libraries' headers and shared libraries, among them OpenMPI's
#     libmpi / libmpi_cxx and what they load (libopen-rte, libopen-pal,
#     hwloc, libevent). OpenMPI's MCA plugins are left
#     out: on the GPU machine dtrain runs with --backend c10d, never MPI_Init,
#     so libmpi only has to link and load.
#   gloo-include/    Gloo's headers (LibTorch's c10d Gloo header includes them)
#   fallback/udev/, fallback/z/   libudev.so.1 and libz.so.1, each put on
#                    LD_LIBRARY_PATH by gpu_check.sh only where the machine
#                    has none of its own.
set -euo pipefail

repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
kit="$repo/.devkit"
grep -qxF '/.devkit/' "$repo/.git/info/exclude" 2>/dev/null || echo '/.devkit/' >>"$repo/.git/info/exclude"

# The library packages are scripts/setup's own list (scripts/debian_packages.sh),
# so a dependency added there reaches the kit too. Each comes with the runtime
# libraries it depends on directly (libxxhash0, libsentencepiece0, ...), as
# apt-cache says; OpenMPI's chain is named here (its -dev package pulls in
# Fortran and InfiniBand, none of which linking needs), and Gloo is headers only.
. "$repo/scripts/debian_packages.sh"
packages=("${DTRAIN_LIBRARY_PACKAGES[@]}" libopenmpi3 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libudev1 zlib1g)
for package in "${DTRAIN_LIBRARY_PACKAGES[@]}"; do
  case $package in libopenmpi-dev | libgloo-dev) continue ;; esac
  packages+=($(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances "$package" |
               awk '$1 == "Depends:" && $2 ~ /^lib.*[0-9]$/ && $2 !~ /^(libc6|libstdc\+\+6|libgcc-s1)$/ {print $2}'))
done
echo "kit packages: ${packages[*]}"

# Built aside and moved into place at the end: a failed download leaves the
# old kit as it was.
final_kit=$kit
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
kit=$work/kit
mkdir -p "$kit/debs" "$kit/unpacked" "$kit/root" "$kit/fallback/udev" "$kit/fallback/z"
(cd "$kit/debs" && apt-get download "${packages[@]}")
for deb in "$kit"/debs/*.deb; do dpkg -x "$deb" "$kit/unpacked"; done

u="$kit/unpacked"
r="$kit/root"
multiarch=usr/lib/x86_64-linux-gnu
mkdir -p "$r/$multiarch" "$r/usr/include" "$r/usr/share"

# Headers and CMake package configs (header-only libraries, GTest).
cp -a "$u/usr/include/." "$r/usr/include/"
cp -a "$u/usr/share/cmake" "$r/usr/share/"
[ -d "$u/usr/lib/cmake" ] && mkdir -p "$r/usr/lib" && cp -a "$u/usr/lib/cmake" "$r/usr/lib/"
cp -a "$u/$multiarch/cmake" "$r/$multiarch/"
cp -a "$u/$multiarch"/libgtest*.a "$u/$multiarch"/libgmock*.a "$r/$multiarch/"

# OpenMPI: include/ and the unversioned link names in openmpi/lib, which point
# at ../../libmpi.so.40 etc. (kept relative, so the kit can move).
mkdir -p "$r/$multiarch/openmpi/lib"
cp -a "$u/$multiarch/openmpi/include" "$r/$multiarch/openmpi/"
cp -a "$u/$multiarch/openmpi/lib/libmpi.so" "$u/$multiarch/openmpi/lib/libmpi_cxx.so" "$r/$multiarch/openmpi/lib/"
# Every other shared library unpacked (OpenMPI's, hwloc, libevent, xxHash,
# SentencePiece, ...) with its link names, except those the machine has its
# own of (libudev, libz: fallback/ below).
for lib in "$u/$multiarch"/lib*.so*; do
  # OpenMPI's plugins' helpers and its Fortran, Java, OpenSHMEM and tracing
  # libraries: nothing dtrain links loads them (and they need InfiniBand, UCX).
  case $(basename "$lib") in
    libudev.so* | libz.so* | libmca_* | libmpi_java* | libmpi_mpifh* | libmpi_usempi* | liboshmem* | libompitrace*) continue ;;
  esac
  cp -a "$lib" "$r/$multiarch/"
done

# Runtime libraries nearly every system has; used only where one is missing.
for pair in udev:libudev.so.1 z:libz.so.1; do
  dir=${pair%%:*} lib=${pair#*:}
  real=$(find "$u" -name "$lib*" -type f | head -n1)
  cp "$real" "$kit/fallback/$dir/$lib"
done

# Gloo's headers (LibTorch's ProcessGroupGloo.hpp includes them; the wheel
# ships none) in a folder of their own, which gpu_check.sh puts on
# CPLUS_INCLUDE_PATH: dtrain's CMake expects them in the system's /usr/include.
mkdir -p "$kit/gloo-include" && mv "$r/usr/include/gloo" "$kit/gloo-include/"
rm -rf "$kit/debs" "$kit/unpacked" "$r/usr/include/openmpi" 2>/dev/null || true
find "$r" -xtype l -print -delete | sed 's/^/dangling link removed: /'

# Every library in the kit must find all it needs within the kit, the
# fallback folder or the C runtime.
missing=$(LD_LIBRARY_PATH="$r/$multiarch:$kit/fallback/udev:$kit/fallback/z" ldd "$r/$multiarch"/lib*.so.* | grep 'not found' || true)
if [ -n "$missing" ]; then
  echo "kit libraries miss dependencies:" >&2
  echo "$missing" >&2
  exit 1
fi
# The commit the kit was made from: the copy that runs on the GPU machine may
# have no git metadata of its own (gpu_runs.sh reads this, not git).
{ git -C "$repo" rev-parse --short HEAD; git -C "$repo" status --porcelain --untracked-files=no | grep -q . && echo "(with uncommitted changes)"; } |
  tr '\n' ' ' >"$kit/commit" || true
rm -rf "$final_kit"
mv "$kit" "$final_kit"
echo "kit: $(du -sh "$final_kit" | cut -f1) in $final_kit"
