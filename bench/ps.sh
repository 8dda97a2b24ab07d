#!/usr/bin/env bash
# Stragglers (issue 7): 4 training ranks, one of them (rank 1) slowed 2x with
# --slow-rank 1:2, on the Fashion-MNIST MLP. Compares synchronous DDP, DDP
# with --balance, ps-sync with one backup worker, ps-async and ps-ssp (s = 2)
# (the ps-* runs: 4 workers + 1 server), and DDP without a straggler as the
# reference, all on the same number of samples (steps x global batch). Then
# the three DDP runs again on 2 ranks: with 4 ranks on a 2-core machine a
# sleeping straggler hands its core to the others, with 2 it does not.
#
#   bench/ps.sh [--steps N] [--batch-size B] [--lr LR] [--repeats R]
#
# Every run is repeated R times (default 3), the repeats taking turns run by
# run so that a slow minute on the shared machine touches every configuration;
# the table shows each one's median throughput and its range.
#
# Prints a table (bench/report.py's "ps" block): throughput (samples whose
# gradients were applied, per second of training), final train loss (DDP: the
# global batch's; ps-async, ps-ssp and backup workers: rank 0's own part), test
# loss and accuracy. Metrics files go to bench/results/ps-*.jsonl, their index
# to bench/results/ps.json.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
RESULTS=bench/results
STEPS=1000
BATCH=128
LR=0.02
REPEATS=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --batch-size) BATCH=$2; shift 2 ;;
    --lr) LR=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    *) echo "bench/ps.sh: unknown argument $1 (use --steps N, --batch-size B, --lr LR, --repeats R)" >&2; exit 2 ;;
  esac
done
export DTRAIN_THREADS_PER_RANK=1 OMP_NUM_THREADS=1
mkdir -p "$RESULTS"
common=(--model mlp --steps "$STEPS" --batch-size "$BATCH" --optimizer sgd --lr "$LR" --log-every 50)
declare -a names=("ddp, no straggler" "ddp" "ddp --balance" "ps-sync, 1 backup worker" "ps-async" "ps-ssp s=2"
                   "ddp, 2 ranks, no straggler" "ddp, 2 ranks" "ddp --balance, 2 ranks")
declare -a flags=(
  "--strategy ddp --nproc 4"
  "--strategy ddp --nproc 4 --slow-rank 1:2"
  "--strategy ddp --nproc 4 --slow-rank 1:2 --balance"
  "--strategy ps-sync --nproc 5 --servers 1 --backup-workers 1 --slow-rank 1:2"
  "--strategy ps-async --nproc 5 --servers 1 --slow-rank 1:2"
  "--strategy ps-ssp --nproc 5 --servers 1 --staleness 2 --slow-rank 1:2"
  "--strategy ddp --nproc 2"
  "--strategy ddp --nproc 2 --slow-rank 1:2"
  "--strategy ddp --nproc 2 --slow-rank 1:2 --balance")
# The run each one's throughput is compared with ("vs" in the table): DDP with
# the straggler on as many ranks.
declare -a versus=("ddp" "ddp" "ddp" "ddp" "ddp" "ddp" "ddp, 2 ranks" "ddp, 2 ranks" "ddp, 2 ranks")
rm -f "$RESULTS"/ps-*.jsonl "$RESULTS"/ps-*.log
for ((r = 0; r < REPEATS; r++)); do
  for i in "${!names[@]}"; do
    run="$RESULTS/ps-$i-$r"
    # shellcheck disable=SC2086  # the flags are words
    echo "bench/ps.sh: [repeat $((r + 1))/$REPEATS] dtrain train ${flags[$i]} ${common[*]}" >&2
    "$BUILD/bin/dtrain" train ${flags[$i]} "${common[@]}" --metrics "$run.jsonl" > "$run.log" 2>&1 ||
      { echo "bench/ps.sh: run failed, see $run.log" >&2; tail -5 "$run.log" >&2; exit 1; }
  done
done

# The index bench/report.py reads: each run's name, flags and metrics file.
python3 - "$RESULTS/ps.json" "$STEPS" "$BATCH" "$REPEATS" "${#names[@]}" "${names[@]}" "${flags[@]}" "${versus[@]}" <<'PY'
import json, os, sys
path, steps, batch, repeats, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
names, flags = sys.argv[6:6 + count], sys.argv[6 + count:6 + 2 * count]
versus = sys.argv[6 + 2 * count:6 + 3 * count]
runs = [dict(name=n, flags=f, versus=v, metrics=["ps-%d-%d.jsonl" % (i, r) for r in range(repeats)])
        for i, (n, f, v) in enumerate(zip(names, flags, versus))]
with open(path + ".partial", "w") as out:
    json.dump(dict(steps=steps, batch_size=batch, slowed="rank 1 is slowed 2x (--slow-rank 1:2)", runs=runs), out, indent=2)
    out.write("\n")
os.replace(path + ".partial", path)
PY
python3 bench/report.py --print ps
