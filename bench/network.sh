#!/usr/bin/env bash
# Overlap on a shaped network (issue 18, item 5): dtrain where communication
# waits on a wire. Two hosts (network namespaces hA and hB on this machine,
# one veth link, tests/multihost/netns_hosts.sh), 1 rank each with 1 intra-op
# thread, MPI over TCP on the link (btl tcp,self; pml ob1). Per link rate:
#
#   link         the link's raw TCP capacity (iperf3 hA -> hB, when installed)
#   collectives  dtrain bench collectives --hosts hA:1,hB:1: bus bandwidth of
#                all_reduce, all_gather, reduce_scatter up to 64 MiB
#   ddp          dtrain bench ddp --model all --hosts ...: ideal, naive, DDP
#                step times and DDP's exposed communication
#   fsdp         dtrain bench fsdp --parts speed --hosts ...: FSDP with and
#                without prefetch against DDP
#   trace        dtrain train --trace of the bench GPT (19M parameters, 6
#                layers, n_embd 512, 8 heads, seq 128, 4 sequences per rank)
#                under ddp and fsdp, then dtrain trace summary: exposed and
#                total communication per rank
#
#     bench/network.sh [--rates 10gbit,25gbit | --rate 10gbit] [--delay 25us] [--quick] [--results DIR]
#
# Results: DIR/network-RATE-{collectives,ddp,fsdp,trace}.json per rate and
# the index DIR/network.json (the link as configured and measured, the
# command, when, how long, the load average); DIR is bench/results, or for
# --quick (small sizes, few steps: a smoke run) a folder under /tmp, so a
# smoke run never replaces measured results. bench/report.py --print network
# prints the table (docs/PERFORMANCE.md, "Overlap on a shaped network").
#
# Shaping, on both ends of the link (egress of each eth0): tc tbf at the rate
# and, under it, netem with the one-way delay. Kernels without sch_netem
# (this project's VM) get the rate alone: the run says so and the index
# records delay_applied false. A veth moves packets with a CPU, so a rate
# above what the cores can copy is not reached: the iperf3 column says what
# the link carried.
#
# Needs root, ip, tc, unshare, mpirun; else prints "SKIP: <reason>" and exits
# $SKIP_EXIT (default 0; bench/run_all.sh sets 77 to tell a skip from a run).
# Idempotent: hosts of an earlier run that was killed outright are removed
# first; its own namespaces, veths and /etc/netns entries go on every exit,
# Ctrl-C included; every step runs under `timeout`. Environment: BUILD
# (default build; uses $BUILD/bin/dtrain, builds nothing), KEEP=1 (keep the
# work folder with every log; kept anyway on failure).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPO=$PWD
BUILD=${BUILD:-build}
[[ $BUILD = /* ]] || BUILD=$REPO/$BUILD
DTRAIN=$BUILD/bin/dtrain
SKIP_EXIT=${SKIP_EXIT:-0}
COMMAND_LINE="bench/network.sh${*:+ $*}"

usage() {
  echo "usage: bench/network.sh [--rates R1,R2 | --rate R] [--delay D] [--quick] [--results DIR]" >&2
  echo "       rates in kbit, mbit or gbit (default 10gbit), delay in us or ms (default 25us)" >&2
  exit 2
}
RATES=(10gbit)
DELAY=25us
QUICK=0
RESULTS=
while [[ $# -gt 0 ]]; do
  case $1 in
    --rate | --rates) [[ $# -ge 2 ]] || usage; IFS=, read -r -a RATES <<< "$2"; shift 2 ;;
    --delay) [[ $# -ge 2 ]] || usage; DELAY=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --results) [[ $# -ge 2 ]] || usage; RESULTS=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) usage ;;
  esac
done
[[ ${#RATES[@]} -gt 0 ]] || usage
for rate in "${RATES[@]}"; do [[ $rate =~ ^[0-9]+(kbit|mbit|gbit)$ ]] || usage; done
[[ $DELAY =~ ^[0-9]+(us|ms)$ ]] || usage

rate_bits() {  # rate_bits 10gbit: bits per second
  local number=${1%%[a-z]*}
  case ${1#"$number"} in
    kbit) echo $((number * 1000)) ;;
    mbit) echo $((number * 1000000)) ;;
    gbit) echo $((number * 1000000000)) ;;
  esac
}

# Sizes and steps: the full run took 10-13 minutes per rate on 2 cores under
# a load average of 9 (2gbit the longer); --quick about 3 minutes per rate.
if ((QUICK)); then
  MAX_BYTES=$((1 << 20)); DDP_FLAGS=(--steps 1 --rounds 1 --warmup 1)
  FSDP_FLAGS=(--speed-steps 1 --rounds 1 --warmup 1); TRACE_STEPS=2; IPERF_SECONDS=2
else
  MAX_BYTES=$((64 << 20)); DDP_FLAGS=(); FSDP_FLAGS=(); TRACE_STEPS=8; IPERF_SECONDS=5
fi
# The 19M GPT of dtrain bench ddp / bench fsdp's speed part, 4 sequences per rank.
GPT_FLAGS=(--model gpt --gpt-layers 6 --gpt-dim 512 --gpt-heads 8 --seq-len 128 --batch-size 8)
HOSTS=hA:1,hB:1

WORK=
failures=0
say() { echo "== $*"; }
skip() { echo "SKIP: $*"; exit "$SKIP_EXIT"; }
die() { echo "FAIL: $*"; failures=$((failures + 1)); exit 1; }

# --- preconditions --------------------------------------------------------
[[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces and shape their link (sudo bench/network.sh)"
for tool in ip tc unshare mpirun timeout python3; do
  command -v "$tool" >/dev/null || skip "'$tool' is not installed (ip, tc: apt-get install iproute2; mpirun: scripts/setup)"
done
[[ -x $DTRAIN ]] || { echo "FAIL: $DTRAIN is missing: build first (make build, or BUILD=DIR)"; exit 1; }
# shellcheck source=tests/multihost/netns_hosts.sh
source "$REPO/tests/multihost/netns_hosts.sh"
netns_install_traps  # on exit: stop jobs, remove the hosts and $WORK (kept on failure or KEEP=1)
WORK=$(mktemp -d /tmp/dtrain-network.XXXXXX)
if [[ -z $RESULTS ]]; then
  RESULTS=bench/results
  ((QUICK)) && RESULTS=$WORK/results
fi
mkdir -p "$RESULTS" || exit 1
# Kept for a quick run (it is the point of one); the logs go with the rest.
((QUICK)) && [[ $RESULTS == "$WORK"/* ]] && KEEP=1

started=$(date -u +%s)
started_text=$(date -u '+%Y-%m-%d %H:%M')
load_average=$(cut -d' ' -f1 /proc/loadavg)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- . ':!bench/results' ':!docs/PERFORMANCE.md' ':!docs/img' 2>/dev/null ||
  commit="$commit (with uncommitted changes)"

# --- the hosts and their link -------------------------------------------------
netns_remove_stale
netns_make_hosts || die "setting up the namespaces failed"
say "hosts: hA ${ADDRESS[hA]}, hB ${ADDRESS[hB]} (namespaces ${NS_PREFIX}hA, ${NS_PREFIX}hB), one veth link"

on_ns() { local host=$1; shift; ip netns exec "$NS_PREFIX$host" "$@"; }
NETEM=0
if on_ns hA tc qdisc add dev eth0 root netem delay 1us 2>/dev/null; then
  on_ns hA tc qdisc del dev eth0 root
  NETEM=1
else
  echo "NOTE: this kernel has no netem qdisc (sch_netem): the link is shaped to the rate alone, no $DELAY delay added"
fi

shape_link() {  # shape_link RATE: tbf at RATE on both ends, netem's one-way delay under it where there is netem
  local rate=$1 host burst
  # Burst: 1 ms at the rate, at least 64 KiB so a whole GSO packet passes
  # (tbf would otherwise split it). Less starves the link where timers fire
  # late (a loaded VM): 2gbit with a 64 KiB burst carried 1.05 Gbit/s, with
  # 1 ms 1.8-1.9. The queue holds 20 ms.
  burst=$(($(rate_bits "$rate") / 8 / 1000))
  ((burst < 65536)) && burst=65536
  for host in hA hB; do
    on_ns "$host" tc qdisc del dev eth0 root 2>/dev/null
    on_ns "$host" tc qdisc add dev eth0 root handle 1: tbf rate "$rate" burst "$burst" latency 20ms || return 1
    if ((NETEM)); then
      on_ns "$host" tc qdisc add dev eth0 parent 1:1 handle 10: netem delay "$DELAY" limit 100000 || return 1
    fi
  done
}

# run_step NAME SECONDS COMMAND...: COMMAND on hA under a time limit, output
# in $WORK/NAME.log (its last lines shown when it fails, which ends the run).
run_step() {
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  # shellcheck disable=SC2046  # netns_mpi_env's words are NAME=VALUE pairs
  netns_on_host hA env $(netns_mpi_env) DTRAIN_PROGRESS_LIVE=0 timeout -k 10 "$limit" "$@" > "$WORK/$name.log" 2>&1 &
  wait $!
  local code=$?
  if [[ $code -ne 0 ]]; then
    echo "   --- $name.log (last lines)"
    tail -n 25 "$WORK/$name.log" | sed 's/^/   | /'
    if [[ $code -eq 124 ]]; then die "$name ran past its $limit s"; fi
    die "$name exited with code $code"
  fi
  echo "   $name: $((SECONDS - start)) s"
}

measure_link() {  # measure_link TAG: iperf3 from hA to hB; writes $WORK/TAG-iperf3.json
  local tag=$1
  command -v iperf3 >/dev/null || { echo "   link: iperf3 not installed, the configured rate stands alone"; return 0; }
  netns_on_host hB timeout $((IPERF_SECONDS + 30)) iperf3 --server --one-off > "$WORK/$tag-iperf3-server.log" 2>&1 &
  local server=$!
  # One client only: a client that connects too early can use up the
  # one-off server's single test. So wait until the server listens.
  timeout 10 sh -c "until ip netns exec ${NS_PREFIX}hB ss -ltn | grep -q ':5201 '; do sleep 0.1; done"
  netns_on_host hA timeout $((IPERF_SECONDS + 15)) iperf3 --client "${ADDRESS[hB]}" --time "$IPERF_SECONDS" --json \
    > "$WORK/$tag-iperf3.json" 2> "$WORK/$tag-iperf3.log"
  wait "$server" 2>/dev/null
  python3 - "$WORK/$tag-iperf3.json" <<'EOF' || { echo "   link: iperf3 failed (see $WORK/$tag-iperf3.log)"; rm -f "$WORK/$tag-iperf3.json"; }
import json, sys
end = json.load(open(sys.argv[1]))["end"]
print("   link: iperf3 hA -> hB %.2f Gbit/s received (TCP, one stream)" % (end["sum_received"]["bits_per_second"] / 1e9))
EOF
}

run_rate() {
  local rate=$1 tag=network-$1
  local delay_text="no delay added (no netem)"
  ((NETEM)) && delay_text="one-way delay $DELAY"
  say "link $rate, $delay_text"
  shape_link "$rate" || die "tc could not shape the link to $rate"
  measure_link "$tag"
  run_step "$tag-collectives" 900 "$DTRAIN" bench collectives --nproc 2 --backend mpi --hosts "$HOSTS" \
    --threads-per-rank 1 --max-bytes "$MAX_BYTES" --json "$RESULTS/$tag-collectives.json"
  run_step "$tag-ddp" 1200 "$DTRAIN" bench ddp --nproc 2 --backend mpi --hosts "$HOSTS" --model all "${DDP_FLAGS[@]}" \
    --json "$RESULTS/$tag-ddp.json"
  run_step "$tag-fsdp" 1200 "$DTRAIN" bench fsdp --parts speed --backend mpi --hosts "$HOSTS" "${FSDP_FLAGS[@]}" \
    --json "$RESULTS/$tag-fsdp.json"
  local strategy
  for strategy in ddp fsdp; do
    # No evaluation but the final one (one window per rank), no samples: the trace is
    # of training steps, plus that one evaluation.
    run_step "$tag-train-$strategy" 600 "$DTRAIN" launch -n 2 --hosts "$HOSTS" --threads-per-rank 1 -- \
      "$DTRAIN" train "${GPT_FLAGS[@]}" --strategy "$strategy" --steps "$TRACE_STEPS" --eval-windows 2 --samples 0 \
      --log-every "$TRACE_STEPS" --seed 1 --trace "$WORK/$tag-trace-$strategy.json"
    timeout 120 "$DTRAIN" trace summary --json "$WORK/$tag-trace-$strategy.json" > "$WORK/$tag-summary-$strategy.json" ||
      die "dtrain trace summary failed on $WORK/$tag-trace-$strategy.json"
  done
  python3 - "$RESULTS/$tag-trace.json" "$TRACE_STEPS" "${GPT_FLAGS[*]}" "$WORK/$tag-summary-ddp.json" \
    "$WORK/$tag-summary-fsdp.json" <<'EOF' || die "could not write $RESULTS/$tag-trace.json"
import json, os, sys
path, steps, flags, ddp, fsdp = sys.argv[1:]
runs = []
for strategy, summary in (("ddp", ddp), ("fsdp", fsdp)):
    ranks = json.load(open(summary))["ranks"]
    runs.append(dict(strategy=strategy, ranks=ranks))
document = dict(steps=int(steps), command="dtrain launch -n 2 --hosts hA:1,hB:1 --threads-per-rank 1 -- dtrain train "
                + flags + " --strategy S --steps " + steps + " --eval-windows 2 --samples 0 --trace PATH; "
                "dtrain trace summary --json PATH", runs=runs)
with open(path + ".partial", "w") as out:
    json.dump(document, out, indent=2)
    out.write("\n")
os.replace(path + ".partial", path)
EOF
  # One line per rate for the index: the link as configured and as measured.
  python3 - "$rate" "$(rate_bits "$rate")" "$DELAY" "$NETEM" "$WORK/$tag-iperf3.json" "$tag" > "$WORK/$tag-link.json" <<'EOF'
import json, os, sys
rate, bits, delay, netem, iperf, tag = sys.argv[1:]
measured = None
if os.path.exists(iperf):
    measured = json.load(open(iperf))["end"]["sum_received"]["bits_per_second"] / 1e9
print(json.dumps(dict(rate=rate, rate_gbps=int(bits) / 1e9, delay=delay if netem == "1" else None,
                      iperf3_gbps=measured, files={part: "%s-%s.json" % (tag, part)
                                                   for part in ("collectives", "ddp", "fsdp", "trace")})))
EOF
}

for rate in "${RATES[@]}"; do run_rate "$rate"; done

python3 - "$RESULTS/network.json" "$COMMAND_LINE" "$started_text" "$(($(date -u +%s) - started))" "$load_average" \
  "$(cut -d' ' -f1 /proc/loadavg)" "$commit" "$(nproc)" "$QUICK" "$DELAY" "$NETEM" "${RATES[@]/#/$WORK/network-}" \
  <<'EOF' || die "could not write $RESULTS/network.json"
import json, os, sys
path, command, started, seconds, load, load_end, commit, cores, quick, delay, netem = sys.argv[1:12]
links = [json.load(open(prefix + "-link.json")) for prefix in sys.argv[12:]]
document = dict(command=command, started_utc=started, seconds=int(seconds), load_average=load,
                load_average_end=load_end, commit=commit, cores=int(cores), quick=quick == "1",
                hosts="2 network namespaces on one machine, one veth link; 1 rank per host, 1 intra-op thread; "
                      "MPI over TCP (btl tcp,self, pml ob1)",
                delay=delay, delay_applied=netem == "1", links=links)
with open(path + ".partial", "w") as out:
    json.dump(document, out, indent=2)
    out.write("\n")
os.replace(path + ".partial", path)
EOF
say "results in $RESULTS ($SECONDS s)"
python3 bench/report.py --results "$RESULTS" --print network
