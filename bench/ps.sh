#!/usr/bin/env bash
# Stragglers (issue 7): 4 training ranks, one of them (rank 1) slowed 2x with
# --slow-rank 1:2, on the Fashion-MNIST MLP. Compares synchronous DDP, DDP
# with --balance, ps-sync with one backup worker, ps-async and ps-ssp (s = 2)
# (the ps-* runs: 4 workers + 1 server), and DDP without a straggler as the
# reference, all on the same number of samples (steps x global batch).
#
#   bench/ps.sh [--steps N] [--batch-size B] [--lr LR]
#
# Prints a table: throughput (samples whose gradients were applied, per
# second of training), final train loss (DDP: the global batch's; ps-async,
# ps-ssp and backup workers: rank 0's own part), test loss and accuracy.
# Metrics files go to bench/results/ps-*.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
RESULTS=bench/results
STEPS=1000
BATCH=128
LR=0.02
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --batch-size) BATCH=$2; shift 2 ;;
    --lr) LR=$2; shift 2 ;;
    *) echo "bench/ps.sh: unknown argument $1 (use --steps N, --batch-size B, --lr LR)" >&2; exit 2 ;;
  esac
done
export DTRAIN_THREADS_PER_RANK=1 OMP_NUM_THREADS=1
mkdir -p "$RESULTS"
common=(--model mlp --steps "$STEPS" --batch-size "$BATCH" --optimizer sgd --lr "$LR" --log-every 50)
declare -a names=("ddp, no straggler" "ddp" "ddp --balance" "ps-sync, 1 backup worker" "ps-async" "ps-ssp s=2")
declare -a flags=(
  "--strategy ddp --nproc 4"
  "--strategy ddp --nproc 4 --slow-rank 1:2"
  "--strategy ddp --nproc 4 --slow-rank 1:2 --balance"
  "--strategy ps-sync --nproc 5 --servers 1 --backup-workers 1 --slow-rank 1:2"
  "--strategy ps-async --nproc 5 --servers 1 --slow-rank 1:2"
  "--strategy ps-ssp --nproc 5 --servers 1 --staleness 2 --slow-rank 1:2")
files=()
for i in "${!names[@]}"; do
  file="$RESULTS/ps-$i.jsonl"
  # shellcheck disable=SC2086  # the flags are words
  echo "bench/ps.sh: dtrain train ${flags[$i]} ${common[*]}" >&2
  "$BUILD/bin/dtrain" train ${flags[$i]} "${common[@]}" --metrics "$file" > "$RESULTS/ps-$i.log" 2>&1 ||
    { echo "bench/ps.sh: run failed, see $RESULTS/ps-$i.log" >&2; tail -5 "$RESULTS/ps-$i.log" >&2; exit 1; }
  files+=("$file")
done

python3 - "$STEPS" "$BATCH" "${files[@]}" -- "${names[@]}" <<'PY'
import json, sys
args = sys.argv[1:]
steps, batch = int(args[0]), int(args[1])
split = args.index("--")
files, names = args[2:split], args[split + 1:]
print("%d steps x %d samples = %d samples per run; rank 1 slowed 2x (except the reference)" % (steps, batch, steps * batch))
print("| run | samples/s | vs ddp | final train loss | test loss | test accuracy | staleness max / mean | dropped | split |")
print("|---|---:|---:|---:|---:|---:|---|---:|---|")
rows = []
for name, path in zip(names, files):
    final = [json.loads(line) for line in open(path)][-1]
    if "samples_per_s" in final:  # ps-*: the samples the servers applied
        rate = final["samples_per_s"]
    else:
        rate = steps * batch / final["train_time_s"]
    rows.append((name, final, rate))
ddp_rate = rows[1][2]
for name, final, rate in rows:
    stale = "%d / %.2f" % (final["max_staleness"], final["mean_staleness"]) if "max_staleness" in final else "-"
    split = " ".join(str(s) for s in final.get("local_batch_sizes") or []) or "-"
    print("| %s | %.0f | %.2fx | %.4f | %.4f | %.2f%% | %s | %s | %s |"
          % (name, rate, rate / ddp_rate, final["loss"], final["eval_loss"], 100 * final["eval_accuracy"], stale,
             final.get("dropped_gradients", "-"), split))
PY
