#!/usr/bin/env bash
# `make bench`: every benchmark of docs/PERFORMANCE.md that this machine runs
# in about 12 minutes (the issue asked for about 15), one after the other (they share the cores, so never two
# at once), then the plots (bench/plot.py) and the tables (bench/report.py).
#
#   BUILD=build bench/run_all.sh [PART...]     PART: collectives-mpi collectives-c10d ddp fsdp ps network
#                                              (default: all; make bench PARTS="ps" passes them)
#
# network (bench/network.sh: two hosts as network namespaces, a shaped link)
# needs root: without it the default run leaves it out, saying so, and
# naming it prints its SKIP line and records nothing. It is not in the 12
# minutes: it took 23 minutes for its two rates under a load average of 9.
#
# Each part's start, duration, command, commit and the load average when it
# began go to bench/results/bench-run.json (a part not run keeps its entry),
# which the report prints as the "measured" line of each table. A part that
# fails stops the run (its results would be missing or stale); nothing is
# redrawn or rewritten then.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
RESULTS=bench/results
ALL_PARTS=(collectives-mpi collectives-c10d ddp fsdp ps network)
mkdir -p "$RESULTS"

wanted=("$@")
full=0
if [[ ${#wanted[@]} -eq 0 ]]; then
  full=1
  wanted=("${ALL_PARTS[@]}")
  if [[ $(id -u) -ne 0 ]]; then
    echo "bench/run_all.sh: leaving out the network part: it needs root (network namespaces, tc)"
    wanted=("${ALL_PARTS[@]:0:${#ALL_PARTS[@]}-1}")  # network is the last
  fi
fi
for name in "${wanted[@]}"; do
  [[ " ${ALL_PARTS[*]} " == *" $name "* ]] ||
    { echo "bench/run_all.sh: no part '$name'; the parts are: ${ALL_PARTS[*]}" >&2; exit 2; }
done
wants() { [[ " ${wanted[*]} " == *" $1 "* ]]; }

# The code measured: the commit, and whether sources differ from it (the
# results and the document this script rewrites do not count).
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- . ':!bench/results' ':!docs/PERFORMANCE.md' ':!docs/img' 2>/dev/null ||
  commit="$commit (with uncommitted changes)"

parts_json=()
run_started=$(date -u +%s)
run_started_text=$(date -u '+%Y-%m-%d %H:%M')
run_load=$(cut -d' ' -f1 /proc/loadavg)

part() {  # part NAME COMMAND...: runs it when NAME was asked for
  local name=$1; shift
  wants "$name" || return 0
  local started load
  started=$(date -u +%s)
  load=$(cut -d' ' -f1 /proc/loadavg)
  echo "bench/run_all.sh: [$name] $*"
  # A part that cannot run here exits 77 after its SKIP line; nothing is recorded.
  local code=0
  SKIP_EXIT=77 "$@" || code=$?
  if [[ $code -eq 77 ]]; then
    echo "bench/run_all.sh: [$name] skipped"
    return 0
  fi
  [[ $code -eq 0 ]] || exit "$code"
  local seconds=$(( $(date -u +%s) - started ))
  echo "bench/run_all.sh: [$name] took ${seconds} s"
  parts_json+=("$(python3 -c 'import json, sys; print(json.dumps(dict(name=sys.argv[1], command=sys.argv[2],
started_utc=sys.argv[3], seconds=int(sys.argv[4]), load_average=sys.argv[5], commit=sys.argv[6])))' \
    "$name" "$*" "$(date -u -d "@$started" '+%Y-%m-%d %H:%M')" "$seconds" "$load" "$commit")")
}

part collectives-mpi "$BUILD/bin/dtrain" bench collectives --nproc 2 --backend mpi \
  --json "$RESULTS/collectives-mpi-np2.json"
part collectives-c10d "$BUILD/bin/dtrain" bench collectives --nproc 2 --backend c10d --max-bytes 16777216 \
  --json "$RESULTS/collectives-c10d-np2.json"
# More rounds than the scripts' defaults (5 and 7): the timed modes take turns
# round by round, and on a shared 2-core machine more rounds steady the
# medians; this is what brings the whole run to about 10-15 minutes.
part ddp env BUILD="$BUILD" bench/ddp.sh --rounds 9
part fsdp env BUILD="$BUILD" bench/fsdp.sh --rounds 11
part ps env BUILD="$BUILD" bench/ps.sh
# 2gbit: where the wire, not the CPU, binds on a 2-core VM (its unshaped veth
# carries 6-8 Gbit/s); 10gbit: the rate issue 18 asks about.
part network env BUILD="$BUILD" bench/network.sh --rates 2gbit,10gbit --delay 25us

# Merge into bench-run.json: the parts run now replace their entries; a run of
# every part (the default) also records itself as the last full run.
python3 - "$RESULTS/bench-run.json" "$full" "$run_started_text" "$(( $(date -u +%s) - run_started ))" \
  "$(nproc)" "$run_load" "${ALL_PARTS[*]}" "${parts_json[@]}" <<'PY'
import json, os, sys
path, full, started, seconds, cores, load, order = sys.argv[1:8]
record = {}
if os.path.exists(path):
    with open(path) as f:
        record = json.load(f)
parts = {p["name"]: p for p in record.get("parts", [])}
parts.update((p["name"], p) for p in map(json.loads, sys.argv[8:]))
record["parts"] = [parts[name] for name in order.split() if name in parts]
record["cores"] = int(cores)
if full == "1":
    record["full_run"] = dict(started_utc=started, seconds=int(seconds), load_average=load)
with open(path + ".partial", "w") as out:
    json.dump(record, out, indent=2)
    out.write("\n")
os.replace(path + ".partial", path)
PY
python3 bench/plot.py
python3 bench/report.py
echo "bench/run_all.sh: done in $(( $(date -u +%s) - run_started )) s; review docs/PERFORMANCE.md (git diff) and commit it with bench/results/ and docs/img/"
