#!/usr/bin/env bash
# Two hosts on one machine (issue 6, item 6): a 2-host x 2-rank training job
# over TCP, checked against the single-host run, then a link cut and a resume.
#
#     tests/multihost/run_two_hosts.sh [mpi] [c10d]       (default: both)
#
# Hosts: two Linux network namespaces, hA (10.213.0.1) and hB (10.213.0.2),
# joined by one veth pair (eth0 in each), made by netns_hosts.sh (which
# bench/network.sh shares). A command runs "on" a host through
# netns_on_host: in its namespace, with /etc/netns/NS/hosts as /etc/hosts
# (hA and hB resolve) and, in a UTS namespace of its own, the hostname hA or
# hB. The namespaces are private to the run (names carry $$), so runs in
# parallel do not collide even though they use the same addresses and port.
#
# The job: dtrain train --model mlp --steps $STEPS --batch-size 64 (DDP, 4
# ranks, Fashion-MNIST), metrics at every step. Per backend:
#   1. Reference: the same job on 4 local ranks (dtrain launch -n 4).
#   2. Two hosts, compared step by step with 1 (bitwise, or within 1e-6:
#      compare_losses.py says which):
#      mpi   from hA: dtrain launch -n 4 --hosts hA:2,hB:2, as a user would;
#            OMPI_MCA_* variables make mpirun start hB's daemon with
#            netns_agent.sh instead of ssh, and keep MPI's traffic on TCP
#            over the veth link (btl tcp,self; pml ob1; its subnet).
#      c10d  each host starts its own 2 ranks, as torchrun would: RANK,
#            WORLD_SIZE=4, LOCAL_RANK, LOCAL_WORLD_SIZE=2, MASTER_ADDR=hA's
#            address, MASTER_PORT, GLOO_SOCKET_IFNAME=eth0.
#   3. Link cut: the job again, with the link slowed (tc tbf) so it runs for
#      a while, --checkpoint-dir and --checkpoint-every $CHECKPOINT_EVERY; once
#      the first checkpoint (or, without checkpoint flags, step
#      $CHECKPOINT_EVERY) is there, hB's eth0 goes down. The job must exit
#      non-zero within DTRAIN_TIMEOUT + $EXIT_MARGIN_S s of the cut, and no
#      process of it may be left on either host 20 s later; what it printed
#      is shown. (mpi: mpirun notices the lost daemon by TCP keepalive, which
#      dtrain launch tunes for --hosts; c10d: the ranks' watchdogs.)
#   4. Resume: link up and unshaped, the job again with --resume; it must
#      finish, and its losses after the checkpoint's step equal the reference.
#      Skipped, saying so, while `dtrain train --help` lacks --resume.
#
# Needs root, ip (iproute2) and unshare; mpirun for the mpi backend; tc with
# the tbf qdisc for steps 3-4. Where something is missing it prints
# "SKIP: <reason>" and exits $SKIP_EXIT (default 0; ctest: SKIP_EXIT=77 with
# SKIP_RETURN_CODE 77). Namespaces, veths and /etc/netns entries are removed
# on every exit (trap), Ctrl-C included; every step runs under `timeout`.
# Environment: BUILD (default build; uses $BUILD/bin/dtrain, builds nothing),
# DTRAIN_TIMEOUT (default 20 s), STEPS (40), CHECKPOINT_EVERY (5),
# LINK_RATE (tbf rate while cutting, default 20mbit), KEEP=1 (keep the work
# folder with every log; kept anyway on failure).
# Takes about 2 minutes on 2 cores (make check-multihost; make check-long runs it).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
REPO=$PWD
HERE=$REPO/tests/multihost
BUILD=${BUILD:-build}
[[ $BUILD = /* ]] || BUILD=$REPO/$BUILD
DTRAIN=$BUILD/bin/dtrain
SKIP_EXIT=${SKIP_EXIT:-0}
STEPS=${STEPS:-40}
CHECKPOINT_EVERY=${CHECKPOINT_EVERY:-5}
LINK_RATE=${LINK_RATE:-20mbit}
EXIT_MARGIN_S=15
export DTRAIN_TIMEOUT=${DTRAIN_TIMEOUT:-20}
export DTRAIN_THREADS_PER_RANK=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 DTRAIN_PROGRESS_LIVE=0

BACKENDS=("$@")
[[ ${#BACKENDS[@]} -gt 0 ]] || BACKENDS=(mpi c10d)
for backend in "${BACKENDS[@]}"; do
  [[ $backend = mpi || $backend = c10d ]] || { echo "usage: $0 [mpi] [c10d]  (got '$backend')" >&2; exit 2; }
done

# shellcheck source=netns_hosts.sh
source "$HERE/netns_hosts.sh"  # NS_PREFIX, SUBNET, ADDRESS, netns_*
MASTER_PORT=29413
JOB=(train --model mlp --steps "$STEPS" --batch-size 64 --seed 3 --log-every 1)
WORK=  # made once the preconditions hold
failures=0
JOB_PIDS=()

say() { echo "== $*"; }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
skip() { echo "SKIP: $*"; exit "$SKIP_EXIT"; }

netns_install_traps  # on exit: stop jobs, remove the hosts and $WORK (kept on failure or KEEP=1)

# --- preconditions --------------------------------------------------------
[[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces (run as root, or sudo $0)"
for tool in ip unshare timeout python3; do
  command -v "$tool" >/dev/null || skip "'$tool' is not installed (ip: apt-get install iproute2)"
done
[[ -x $DTRAIN ]] || { echo "FAIL: $DTRAIN is missing: build first (make build, or BUILD=DIR)"; exit 1; }
WORK=$(mktemp -d /tmp/dtrain-multihost.XXXXXX)

# --- the two hosts ----------------------------------------------------------
netns_make_hosts || { echo "FAIL: setting up the namespaces failed"; exit 1; }
say "hosts: $(netns_on_host hA hostname) ${ADDRESS[hA]} (namespace ${NS_PREFIX}hA), $(netns_on_host hB hostname) ${ADDRESS[hB]} (${NS_PREFIX}hB)"

TBF_OK=
if ip netns exec "${NS_PREFIX}hA" tc qdisc add dev eth0 root tbf rate "$LINK_RATE" burst 32kbit latency 400ms 2>/dev/null; then
  ip netns exec "${NS_PREFIX}hA" tc qdisc del dev eth0 root
  TBF_OK=1
fi
RESUME_OK=
[[ $("$DTRAIN" train --help 2>/dev/null) == *--resume* ]] && RESUME_OK=1

# --- the jobs ---------------------------------------------------------------
# run_two_hosts BACKEND LOG_PREFIX TRAIN_FLAGS...: starts the 2 x 2 job in the
# background; its pids land in JOB_PIDS.
run_two_hosts() {
  local backend=$1 log=$2
  shift 2
  JOB_PIDS=()
  if [[ $backend = mpi ]]; then
    # shellcheck disable=SC2046  # mpi_env's words are NAME=VALUE pairs
    netns_on_host hA env $(netns_mpi_env) timeout -k 5 150 "$DTRAIN" launch -n 4 --hosts hA:2,hB:2 -- \
      "$DTRAIN" "${JOB[@]}" "$@" > "$log.launch.log" 2>&1 &
    JOB_PIDS+=($!)
    return
  fi
  local host local_rank rank=0
  for host in hA hB; do
    for local_rank in 0 1; do
      netns_on_host "$host" env RANK=$rank WORLD_SIZE=4 LOCAL_RANK=$local_rank LOCAL_WORLD_SIZE=2 \
        MASTER_ADDR="${ADDRESS[hA]}" MASTER_PORT=$MASTER_PORT GLOO_SOCKET_IFNAME=eth0 \
        timeout -k 5 150 "$DTRAIN" "${JOB[@]}" "$@" > "$log.rank$rank.log" 2>&1 &
      JOB_PIDS+=($!)
      rank=$((rank + 1))
    done
  done
}

wait_job() {  # wait_job: waits for JOB_PIDS; returns the first non-zero exit code
  local pid code first=0
  for pid in "${JOB_PIDS[@]}"; do
    wait "$pid"
    code=$?
    [[ $first -eq 0 ]] && first=$code
  done
  return "$first"
}

show_logs() {  # show_logs PREFIX: the logs of a job, indented
  local file
  for file in "$1".*log; do
    echo "   --- $(basename "$file")"
    sed 's/^/   | /' "$file" | tail -n "${2:-15}"
  done
}

# latest_checkpoint_step DIR: the step of the latest complete checkpoint
# under DIR (one with its manifest, not in a DIR.tmp-STEP being written), or nothing.
latest_checkpoint_step() {
  python3 - "$1" <<'EOF' 2>/dev/null
import json, pathlib, sys
steps = []
for manifest in pathlib.Path(sys.argv[1]).rglob("manifest.json"):
    if ".tmp" in str(manifest.parent.relative_to(sys.argv[1])):
        continue
    try:
        steps.append(json.loads(manifest.read_text())["step"])
    except (ValueError, KeyError, OSError):
        pass
if steps:
    print(max(steps))
EOF
}

latest_metrics_step() {  # latest_metrics_step FILE: its last step with a loss (0: none yet)
  python3 - "$1" <<'EOF' 2>/dev/null || echo 0
import json, sys
steps = [0]
for line in open(sys.argv[1]):
    try:
        record = json.loads(line)
    except ValueError:
        continue
    if "loss" in record and "step" in record:
        steps.append(record["step"])
print(max(steps))
EOF
}

shape_link() {  # shape_link on|off: slows both ends of the link (so a run lasts long enough to cut)
  local host
  for host in hA hB; do
    if [[ $1 = on ]]; then
      ip netns exec "$NS_PREFIX$host" tc qdisc add dev eth0 root tbf rate "$LINK_RATE" burst 32kbit latency 400ms
    else
      ip netns exec "$NS_PREFIX$host" tc qdisc del dev eth0 root 2>/dev/null
    fi
  done
}

check_backend() {
  local backend=$1 out=$WORK/$1
  local start
  mkdir -p "$out"

  say "$backend: reference, 4 ranks on one host"
  start=$SECONDS
  timeout -k 5 120 "$DTRAIN" launch -n 4 --backend "$backend" -- "$DTRAIN" "${JOB[@]}" \
    --metrics "$out/reference.jsonl" > "$out/reference.launch.log" 2>&1 &
  JOB_PIDS=($!)
  if ! wait_job; then
    fail "$backend: the single-host reference run failed"
    show_logs "$out/reference"
    return
  fi
  echo "   $((SECONDS - start)) s"

  say "$backend: 2 hosts x 2 ranks over the veth link"
  start=$SECONDS
  run_two_hosts "$backend" "$out/two-hosts" --metrics "$out/two-hosts.jsonl"
  if ! wait_job; then
    fail "$backend: the 2-host run failed"
    show_logs "$out/two-hosts"
    return
  fi
  echo "   $((SECONDS - start)) s"
  python3 "$HERE/compare_losses.py" "$out/reference.jsonl" "$out/two-hosts.jsonl" | sed 's/^/   /'
  [[ ${PIPESTATUS[0]} -eq 0 ]] || fail "$backend: the 2-host losses differ from the single-host run"

  if [[ -z $TBF_OK ]]; then
    echo "SKIP ($backend link cut): tc cannot add a tbf qdisc here, so a run cannot be slowed enough to cut it mid-run"
    return
  fi
  say "$backend: cut the link mid-run (hB: ip link set eth0 down), DTRAIN_TIMEOUT=$DTRAIN_TIMEOUT"
  local checkpoint_flags=()
  [[ -n $RESUME_OK ]] && checkpoint_flags=(--checkpoint-dir "$out/checkpoints" --checkpoint-every "$CHECKPOINT_EVERY")
  shape_link on
  run_two_hosts "$backend" "$out/cut" --metrics "$out/cut.jsonl" "${checkpoint_flags[@]}"
  local deadline=$((SECONDS + 60)) checkpoint_step='' running
  while ((SECONDS < deadline)); do
    if [[ -n $RESUME_OK ]]; then
      checkpoint_step=$(latest_checkpoint_step "$out/checkpoints")
      [[ -n $checkpoint_step ]] && break
    elif [[ $(latest_metrics_step "$out/cut.jsonl") -ge $CHECKPOINT_EVERY ]]; then
      break
    fi
    running=0
    for pid in "${JOB_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && running=1; done
    ((running)) || break
    sleep 0.1
  done
  ip -n "${NS_PREFIX}hB" link set eth0 down
  local cut_at=$SECONDS cut_step
  cut_step=$(latest_metrics_step "$out/cut.jsonl")
  echo "   cut at step $cut_step of $STEPS${checkpoint_step:+ (checkpoint of step $checkpoint_step complete)}"
  wait_job
  local code=$? took=$((SECONDS - cut_at))
  echo "   the job exited with code $code $took s after the cut"
  # Nothing of the job may outlive it on either host (hB's ranks cannot hear from hA any more).
  local left_deadline=$((SECONDS + 20)) left
  while left=$(ip netns pids "${NS_PREFIX}hA"; ip netns pids "${NS_PREFIX}hB") && [[ -n $left ]] &&
    ((SECONDS < left_deadline)); do
    sleep 0.2
  done
  if [[ -n $left ]]; then
    fail "$backend: processes of the job still run 20 s after it ended: $(ps -o pid=,comm= -p "${left//$'\n'/,}" | tr '\n' ' ')"
  else
    echo "   every process of the job on hA and hB was gone $((SECONDS - cut_at)) s after the cut"
  fi
  if [[ $code -eq 0 ]]; then
    fail "$backend: the job did not fail after the link cut (it finished: raise STEPS or lower LINK_RATE)"
  elif ((took > DTRAIN_TIMEOUT + EXIT_MARGIN_S)); then
    fail "$backend: the job took $took s to fail after the cut (DTRAIN_TIMEOUT=$DTRAIN_TIMEOUT + $EXIT_MARGIN_S s allowed)"
  fi
  echo "   what it said (progress lines left out):"
  cat "$out"/cut.*log | grep -v -E '^(step [0-9]+/|dtrain train: |  [a-z]+  |$)|plm:rsh: Warning: setpgid' |
    awk '!seen[$0]++' | head -n 25 | sed 's/^/   | /'
  ip -n "${NS_PREFIX}hB" link set eth0 up
  shape_link off

  if [[ -z $RESUME_OK ]]; then
    echo "SKIP ($backend resume): $DTRAIN train has no --resume yet (rebuild once the checkpoint flags are in)"
    return
  fi
  # The job may have completed another checkpoint between the poll and the cut.
  checkpoint_step=$(latest_checkpoint_step "$out/checkpoints")
  if [[ -z $checkpoint_step ]]; then
    fail "$backend: no complete checkpoint before the cut, nothing to resume from"
    return
  fi
  say "$backend: link up, resume from the last checkpoint (step $checkpoint_step)"
  start=$SECONDS
  run_two_hosts "$backend" "$out/resume" --metrics "$out/resume.jsonl" "${checkpoint_flags[@]}" --resume
  if ! wait_job; then
    fail "$backend: the resumed run failed"
    show_logs "$out/resume"
    return
  fi
  echo "   $((SECONDS - start)) s"
  python3 "$HERE/compare_losses.py" "$out/reference.jsonl" "$out/resume.jsonl" --resumed-after "$checkpoint_step" |
    sed 's/^/   /'
  [[ ${PIPESTATUS[0]} -eq 0 ]] || fail "$backend: the resumed losses differ from the uninterrupted run"
}

for backend in "${BACKENDS[@]}"; do
  if [[ $backend = mpi ]] && ! command -v mpirun >/dev/null; then
    echo "SKIP (mpi): mpirun is not installed (scripts/setup installs openmpi-bin)"
    continue
  fi
  check_backend "$backend"
done

if ((failures > 0)); then
  echo "multihost: $failures check(s) failed"
  exit 1
fi
echo "multihost: all checks passed ($SECONDS s)"
