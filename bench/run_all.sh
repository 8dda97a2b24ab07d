#!/usr/bin/env bash
# `make bench`: every benchmark of docs/PERFORMANCE.md that this machine runs
# in about 15 minutes, one after the other (they share the cores, so never two
# at once), then the plots (bench/plot.py) and the tables (bench/report.py).
#
#   BUILD=build bench/run_all.sh
#
# Each part's start, duration, command and the load average when it began go
# to bench/results/bench-run.json, which the report prints as the "measured"
# line of each table. A part that fails stops the run (its results would be
# missing or stale); the tables of the parts already run are not rewritten.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
RESULTS=bench/results
mkdir -p "$RESULTS"

parts_json=()
run_started=$(date -u +%s)
run_started_text=$(date -u '+%Y-%m-%d %H:%M')
run_load=$(cut -d' ' -f1 /proc/loadavg)
# Taken before the run: the results it writes are tracked files, so the tree is dirty after it.
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- 2>/dev/null || commit="$commit (with uncommitted changes)"

part() {  # part NAME COMMAND...
  local name=$1; shift
  local started load
  started=$(date -u +%s)
  load=$(cut -d' ' -f1 /proc/loadavg)
  echo "bench/run_all.sh: [$name] $*"
  "$@"
  local seconds=$(( $(date -u +%s) - started ))
  echo "bench/run_all.sh: [$name] took ${seconds} s"
  parts_json+=("$(python3 -c 'import json, sys; print(json.dumps(dict(name=sys.argv[1], command=sys.argv[2],
started_utc=sys.argv[3], seconds=int(sys.argv[4]), load_average=sys.argv[5])))' \
    "$name" "$*" "$(date -u -d "@$started" '+%Y-%m-%d %H:%M')" "$seconds" "$load")")
}

part collectives-mpi "$BUILD/bin/dtrain" bench collectives --nproc 2 --backend mpi \
  --json "$RESULTS/collectives-mpi-np2.json"
part collectives-c10d "$BUILD/bin/dtrain" bench collectives --nproc 2 --backend c10d --max-bytes 16777216 \
  --json "$RESULTS/collectives-c10d-np2.json"
# More rounds than the scripts' defaults (5 and 7): the timed modes take turns
# round by round, and on a shared 2-core machine more rounds steady the
# medians; this is what brings the whole run to about 15 minutes.
part ddp env BUILD="$BUILD" bench/ddp.sh --rounds 9
part fsdp env BUILD="$BUILD" bench/fsdp.sh --rounds 11
part ps env BUILD="$BUILD" bench/ps.sh

python3 - "$RESULTS/bench-run.json" "$run_started_text" "$(( $(date -u +%s) - run_started ))" "$commit" \
  "$(nproc)" "$run_load" "${parts_json[@]}" <<'PY'
import json, os, sys
path, started, seconds, commit, cores, load = sys.argv[1:7]
record = dict(started_utc=started, seconds=int(seconds), commit=commit, cores=int(cores), load_average=load,
              parts=[json.loads(p) for p in sys.argv[7:]])
with open(path + ".partial", "w") as out:
    json.dump(record, out, indent=2)
    out.write("\n")
os.replace(path + ".partial", path)
PY
python3 bench/plot.py
python3 bench/report.py
echo "bench/run_all.sh: done in $(( $(date -u +%s) - run_started )) s; review docs/PERFORMANCE.md (git diff) and commit it with bench/results/ and docs/img/"
