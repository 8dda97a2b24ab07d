#!/usr/bin/env bash
# `make bench`: every benchmark of docs/PERFORMANCE.md that this machine runs
# in about 12 minutes (the issue asked for about 15), one after the other (they share the cores, so never two
# at once), then the plots (bench/plot.py) and the tables (bench/report.py).
#
#   BUILD=build bench/run_all.sh [PART...]     PART: collectives-mpi collectives-c10d ddp fsdp ps
#                                              (default: all; make bench PARTS="ps" passes them)
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
ALL_PARTS=(collectives-mpi collectives-c10d ddp fsdp ps)
mkdir -p "$RESULTS"

wanted=("$@")
[[ ${#wanted[@]} -gt 0 ]] || wanted=("${ALL_PARTS[@]}")
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
  "$@"
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

# Merge into bench-run.json: the parts run now replace their entries; a run of
# every part also records itself as the last full run.
full=0
[[ ${#wanted[@]} -eq ${#ALL_PARTS[@]} ]] && full=1
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
