#!/usr/bin/env bash
# make check-fresh-machine: the README's promise, tried on a newcomer's machine.
#
# Builds a bare Debian 12 (bookworm) root with debootstrap --variant=minbase
# plus only what a newcomer would install by hand (g++, cmake, make, git,
# python3-pip, python3-venv, ca-certificates) -- no CUDA toolkit, no
# GoogleTest, no LibTorch -- clones this repository into it and runs
# `make test` there as root. Fails if anything fails; prints how long each
# phase took (recorded in the README's build section).
#
#     tests/fresh_machine/check_fresh_machine.sh [ROOT_DIR]
#
# ROOT_DIR defaults to $BUILD/fresh-machine/root (BUILD defaults to build);
# it is removed and made anew on every run, so nothing of an earlier run
# helps. The host's CA certificates and pip settings (PIP_* variables,
# /etc/pip.conf) are copied in, so the root reaches the package registries the
# same way the host does. The clone is of the committed HEAD: commit first.
#
# Needs root (debootstrap, chroot, mounts); otherwise prints "SKIP: <reason>"
# and exits $SKIP_EXIT (default 0). Takes about as long as a clean
# `make test` plus the install (see the README's build section).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD=${BUILD:-build}
SKIP_EXIT=${SKIP_EXIT:-0}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
root="${1:-$repo/$BUILD/fresh-machine/root}"
log_dir="$(dirname "$root")"

skip() { echo "SKIP: $*"; exit "$SKIP_EXIT"; }
[[ $(id -u) -eq 0 ]] || skip "needs root (debootstrap, chroot and mounts)"
if ! command -v debootstrap >/dev/null; then
  echo "check-fresh-machine: installing debootstrap"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

mounts=(proc sys dev dev/pts dev/shm)
unmount_all() {
  local m
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    m="$root/${mounts[i]}"
    mountpoint -q "$m" 2>/dev/null && umount -l "$m" || true
  done
}
trap unmount_all EXIT

seconds_since() { echo $(( $(date +%s) - $1 )); }
phase_start=$(date +%s)
all_start=$phase_start

# A stale root from an interrupted run may still have things mounted.
unmount_all
rm -rf "$root"
mkdir -p "$root"
echo "== debootstrap bookworm (minbase) into $root"
debootstrap --variant=minbase \
  --include=g++,cmake,make,git,python3-pip,python3-venv,ca-certificates \
  bookworm "$root" "$MIRROR" > "$log_dir/debootstrap.log" 2>&1 ||
  { tail -n 30 "$log_dir/debootstrap.log"; echo "check-fresh-machine: debootstrap failed (log: $log_dir/debootstrap.log)" >&2; exit 1; }
debootstrap_s=$(seconds_since "$phase_start")
echo "   ${debootstrap_s} s"

# Reach the registries as the host does: its CA bundle (which may hold a
# proxy's certificate) and its pip configuration; its resolver.
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
[[ -f /etc/pip.conf ]] && cp /etc/pip.conf "$root/etc/pip.conf"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
# debootstrap writes no /etc/hosts; an installed Debian has one (localhost).
[[ -f $root/etc/hosts ]] || cp /etc/hosts "$root/etc/hosts"
# The host's apt sources name the same Debian archive; debootstrap wrote its
# own (bookworm main), which is what a newcomer has.

for m in "${mounts[@]}"; do mkdir -p "$root/$m"; done
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
mount -t tmpfs -o size=4g tmpfs "$root/dev/shm"

echo "== git clone $repo (HEAD $(git -C "$repo" rev-parse --short HEAD))"
git clone -q "$repo" "$root/home/newcomer/dtrain"

# The variables a shell on the host would pass on (PIP_* settings, CA paths),
# nothing of the host's toolchains.
env_args=(HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 TERM=dumb)
while IFS='=' read -r name value; do
  case $name in
    PIP_*|SSL_CERT_FILE|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE|GIT_SSL_CAINFO) env_args+=("$name=$value") ;;
  esac
done < <(env)
# PIP_FIND_LINKS may name a host folder that the root does not have.
[[ -n ${PIP_FIND_LINKS:-} && ! -d $root$PIP_FIND_LINKS ]] && mkdir -p "$root$PIP_FIND_LINKS"

echo "== make test inside the root (setup, build, every test); log: $log_dir/make-test.log"
phase_start=$(date +%s)
set +e
chroot "$root" /usr/bin/env -i "${env_args[@]}" bash -c 'cd /home/newcomer/dtrain && make test' \
  > "$log_dir/make-test.log" 2>&1
status=$?
set -e
make_test_s=$(seconds_since "$phase_start")
grep -E "^setup:|^build:|tests passed|tests failed|Total Test time|skipped" "$log_dir/make-test.log" || true
echo "   make test: ${make_test_s} s, exit code $status"
echo "check-fresh-machine: debootstrap ${debootstrap_s} s, make test ${make_test_s} s, all $(seconds_since "$all_start") s"
if ((status != 0)); then
  tail -n 60 "$log_dir/make-test.log"
  echo "check-fresh-machine: FAILED: make test exited $status in a bare Debian 12 root (log: $log_dir/make-test.log)" >&2
  exit 1
fi
echo "check-fresh-machine: passed"
