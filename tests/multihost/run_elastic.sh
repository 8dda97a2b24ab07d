#!/usr/bin/env bash
# A job that loses a host and goes on without it, then grows back when the
# host returns (issue 19, item 2): dtrain train --nproc 2:4 --hosts
# hA:2,hB:2 --max-restarts 2 on the two network-namespace hosts of
# netns_hosts.sh (run_two_hosts.sh says how they are made and how mpirun
# reaches hB).
#
#     tests/multihost/run_elastic.sh
#
#   1. The elastic job: FSDP GPT, $STEPS steps on a corpus whose epoch 0 ends
#      at about step $EPOCH_STEPS, a checkpoint every $CHECKPOINT_EVERY steps, rank
#      0 slowed (--slow-rank) so that the run lasts long enough to cut. Once
#      step $CUT_AT is done, hB's eth0 goes down.
#   2. Shrink: the launcher logs the failure, finds hB lost when it probes the
#      hosts, and restarts on hA's 2 ranks from the newest checkpoint.
#      Printed: the time from the cut to the first step trained after it.
#   3. Grow: once that attempt runs, hB's link comes back; within
#      DTRAIN_HOST_PROBE_INTERVAL the launcher finds hB answering, stops the
#      job with SIGUSR1 (a checkpoint at the end of its step) and restarts it
#      on 4 ranks from that checkpoint, no step lost. The job must finish (exit 0), its final metrics line saying
#      restarts = 2 and world_size = 4.
#   4. Losses: the steps trained on 2 ranks equal (within 1e-6,
#      compare_losses.py) a run started at 2 ranks from a copy of the shrink's
#      checkpoint, and the steps after the grow a run started at 4 ranks from
#      a copy of the grow's checkpoint.
#   5. Every sample of epoch 0 was trained on exactly once, counting each step
#      as the attempt that completed it (DTRAIN_TEST_SAMPLE_LOG,
#      tests/train/check_samples.py): the resizes neither repeat nor skip data.
#
# Needs root, ip, unshare and mpirun; otherwise prints "SKIP: <reason>" and
# exits $SKIP_EXIT (default 0; ctest: 77). Environment: BUILD (default
# build), DTRAIN_TIMEOUT (default 20 s), KEEP=1 keeps the work folder.
# Takes about 2 minutes on 2 cores (make check-multihost; make check-long).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
REPO=$PWD
HERE=$REPO/tests/multihost
BUILD=${BUILD:-build}
[[ $BUILD = /* ]] || BUILD=$REPO/$BUILD
DTRAIN=$BUILD/bin/dtrain
SKIP_EXIT=${SKIP_EXIT:-0}
STEPS=${STEPS:-90}
CUT_AT=${CUT_AT:-34}
CHECKPOINT_EVERY=${CHECKPOINT_EVERY:-10}
SLOW=${SLOW:-0:30}  # --slow-rank: rank 0 sleeps 29 x its compute time each step
BATCH=16
SEQ_LEN=32
EPOCH_STEPS=70
export DTRAIN_TIMEOUT=${DTRAIN_TIMEOUT:-20}
export DTRAIN_HOST_PROBE_TIMEOUT=${DTRAIN_HOST_PROBE_TIMEOUT:-5}
export DTRAIN_HOST_PROBE_INTERVAL=${DTRAIN_HOST_PROBE_INTERVAL:-2}
export DTRAIN_THREADS_PER_RANK=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 DTRAIN_PROGRESS_LIVE=0

# shellcheck source=netns_hosts.sh
source "$HERE/netns_hosts.sh"  # NS_PREFIX, SUBNET, ADDRESS, netns_*
WORK=
failures=0

say() { echo "== $*"; }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
skip() { echo "SKIP: $*"; exit "$SKIP_EXIT"; }

netns_install_traps  # on exit: stop jobs, remove the hosts and $WORK (kept on failure or KEEP=1)

[[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces (run as root, or sudo $0)"
for tool in ip unshare timeout python3 mpirun; do
  command -v "$tool" >/dev/null || skip "'$tool' is not installed (ip: iproute2; mpirun: openmpi-bin)"
done
[[ -x $DTRAIN ]] || { echo "FAIL: $DTRAIN is missing: build first (make build, or BUILD=DIR)"; exit 1; }
WORK=$(mktemp -d /tmp/dtrain-elastic.XXXXXX)
netns_make_hosts || { echo "FAIL: setting up the namespaces failed"; exit 1; }

# A corpus of about EPOCH_STEPS global batches of SEQ_LEN-byte windows (its
# last 10% is the validation split).
head -c $(((EPOCH_STEPS * BATCH * SEQ_LEN + SEQ_LEN + 1) * 10 / 9 + 1)) /usr/share/games/fortunes/art > "$WORK/corpus.txt" ||
  skip "/usr/share/games/fortunes/art is missing (scripts/setup installs fortunes)"
JOB=(train --model gpt --gpt-layers 2 --gpt-dim 64 --gpt-heads 4 --seq-len "$SEQ_LEN" --data "text:$WORK/corpus.txt"
  --strategy fsdp --batch-size "$BATCH" --steps "$STEPS" --seed 5 --log-every 1 --eval-every 0 --samples 0
  --checkpoint-every "$CHECKPOINT_EVERY" --keep-last 0)
# shellcheck disable=SC2046  # netns_mpi_env's words are NAME=VALUE pairs
on_hA() { netns_on_host hA env $(netns_mpi_env) "$@"; }
stamp() {  # each line with the time it was read
  python3 -u -c 'import sys, time
for line in sys.stdin: print(f"{time.time():.3f} {line}", end="", flush=True)'
}
latest_step() {  # latest_step METRICS: the last step with a loss (0: none yet)
  python3 -c 'import json, sys
steps = [0]
for line in open(sys.argv[1]):
    try: record = json.loads(line)
    except ValueError: continue
    if "loss" in record and "step" in record: steps.append(record["step"])
print(max(steps))' "$1" 2>/dev/null || echo 0
}
wait_for_log() {  # wait_for_log REGEX SECONDS: until the job's log matches (1: it did not, or the job ended)
  local deadline=$((SECONDS + $2))
  until grep -qE "$1" "$WORK/elastic.log" 2>/dev/null; do
    ((SECONDS > deadline)) && return 1
    kill -0 "$job" 2>/dev/null || return 1
    sleep 0.05
  done
}

say "elastic job: --nproc 2:4 --hosts hA:2,hB:2 --max-restarts 2, FSDP GPT, $STEPS steps"
start=$SECONDS
DTRAIN_TEST_SAMPLE_LOG=$WORK/samples.jsonl on_hA timeout -k 5 400 "$DTRAIN" "${JOB[@]}" --slow-rank "$SLOW" \
  --nproc 2:4 --hosts hA:2,hB:2 --max-restarts 2 --checkpoint-dir "$WORK/checkpoints" --metrics "$WORK/elastic.jsonl" \
  2>&1 | stamp > "$WORK/elastic.log" &
job=$!
deadline=$((SECONDS + 150))
until (($(latest_step "$WORK/elastic.jsonl") >= CUT_AT)) || ((SECONDS > deadline)) || ! kill -0 $job 2>/dev/null; do
  sleep 0.05
done
ip -n "${NS_PREFIX}hB" link set eth0 down
cut_time=$(date +%s.%N)
echo "   hB cut off after step $(latest_step "$WORK/elastic.jsonl") ($((SECONDS - start)) s into the run)"
if wait_for_log 'starting 2 ranks on hA:2' 120 && wait_for_log 'resuming from step' 60; then
  ip -n "${NS_PREFIX}hB" link set eth0 up
  echo "   hB's link back up once the job resumed on hA alone ($((SECONDS - start)) s into the run)"
else
  fail "the job did not restart on hA's 2 ranks after the cut"
  ip -n "${NS_PREFIX}hB" link set eth0 up
fi
wait $job
code=$?
echo "   the job exited with code $code, $((SECONDS - start)) s after it started"
echo "   what the launcher said:"
grep -E 'dtrain launch:|resuming from' "$WORK/elastic.log" | cut -d' ' -f2- | cut -c1-220 | sed 's/^/   | /'
[[ $code -eq 0 ]] || { fail "the elastic job did not finish"; tail -n 30 "$WORK/elastic.log"; exit 1; }

shrink_step=$(grep -oE 'restart 1 of 2: .*restarting from the checkpoint of step [0-9]+' "$WORK/elastic.log" |
  grep -oE '[0-9]+$' | head -1)
grow_step=$(grep -oE 'restart to grow .* with the checkpoint of step [0-9]+' "$WORK/elastic.log" |
  grep -oE '[0-9]+$' | head -1)
[[ -n $shrink_step ]] || fail "the launcher did not log a restart from a checkpoint after the cut"
grep -q 'starting 2 ranks on hA:2 (lost: hB:2' "$WORK/elastic.log" || fail "the restart did not run on hA's 2 ranks with hB lost"
[[ -n $grow_step ]] || fail "the launcher did not restart the job to grow once hB answered again"
# After the grow's restart (not the first attempt's line), on 4 ranks, with no step lost.
# (One awk, not sed | grep -q: under pipefail grep -q's early exit can kill
# sed with SIGPIPE and fail the check although the line is there.)
awk '/restart to grow/ { grown = 1 } grown && /starting 4 ranks on hA:2,hB:2$/ { found = 1 } END { exit !found }' \
  "$WORK/elastic.log" ||
  fail "the job did not grow back to 4 ranks on hA and hB after the restart to grow"
grep -q 'restart to grow .* 0 steps lost' "$WORK/elastic.log" || fail "the grow lost steps"
python3 - "$WORK/elastic.jsonl" <<'PY' || fail "the final metrics line does not say restarts = 2, world_size = 4"
import json, sys
final = [json.loads(line) for line in open(sys.argv[1]) if '"final"' in line][-1]
print(f"   final line: restarts {final.get('restarts')}, steps_lost {final.get('steps_lost')}, "
      f"world_size {final.get('world_size')}")
sys.exit(0 if final.get("restarts") == 2 and final.get("world_size") == 4 else 1)
PY
# Back to training: the first progress line after the launcher's "starting 2 ranks".
python3 - "$WORK/elastic.log" "$cut_time" <<'PY'
import re, sys
cut = float(sys.argv[2])
restarted = None
for line in open(sys.argv[1]):
    stamp, _, text = line.partition(" ")
    if "starting 2 ranks on hA:2" in text:
        restarted = float(stamp)
    elif restarted and re.match(r"step \d+/", text):
        print(f"   from the cut to training again: {float(stamp) - cut:.1f} s "
              f"(restart begun {restarted - cut:.1f} s after the cut)")
        break
PY

# reference NAME STEP NPROC HOSTS: the job started at NPROC ranks from a copy of the checkpoint of STEP.
reference() {
  mkdir -p "$WORK/$1"
  cp -r "$WORK/checkpoints/step-$(printf '%08d' "$2")" "$WORK/$1/"
  on_hA timeout -k 5 200 "$DTRAIN" "${JOB[@]}" --nproc "$3" --hosts "$4" --checkpoint-dir "$WORK/$1" --resume \
    --metrics "$WORK/$1.jsonl" > "$WORK/$1.log" 2>&1 || { fail "the reference run $1 failed"; tail -n 20 "$WORK/$1.log"; }
}
if [[ -n $shrink_step && -n $grow_step ]]; then
  say "the steps on 2 ranks (after $shrink_step, through $grow_step) against 2 ranks started from that checkpoint"
  reference after-shrink "$shrink_step" 2 hA:2
  python3 "$HERE/compare_losses.py" "$WORK/elastic.jsonl" "$WORK/after-shrink.jsonl" --resumed-after "$shrink_step" \
    --through "$grow_step" | sed 's/^/   /'
  [[ ${PIPESTATUS[0]} -eq 0 ]] || fail "the losses after the shrink differ from a 2-rank run from the same checkpoint"
  say "the steps after the grow (after $grow_step) against 4 ranks started from that checkpoint"
  reference after-grow "$grow_step" 4 hA:2,hB:2
  python3 "$HERE/compare_losses.py" "$WORK/elastic.jsonl" "$WORK/after-grow.jsonl" --resumed-after "$grow_step" |
    sed 's/^/   /'
  [[ ${PIPESTATUS[0]} -eq 0 ]] || fail "the losses after the grow differ from a 4-rank run from the same checkpoint"
fi

say "every sample of epoch 0 trained on exactly once across the shrink and the grow"
python3 "$REPO/tests/train/check_samples.py" --epoch 0 "$WORK/samples.jsonl" | sed 's/^/   /'
[[ ${PIPESTATUS[0]} -eq 0 ]] || fail "samples of epoch 0 were repeated or skipped across the resizes"

if ((failures > 0)); then
  echo "elastic: $failures check(s) failed"
  exit 1
fi
echo "elastic: all checks passed ($SECONDS s)"
