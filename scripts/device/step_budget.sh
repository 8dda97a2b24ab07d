# Sourced by gpu_check.sh and gpu_runs.sh: the log's step headers, the
# summary line's notes, and each step's share of DEADLINE. The caller sets
# started=$SECONDS, status_line=() and DEADLINE first.
step() { echo; echo "=== [$((SECONDS - started))s] $*"; }
note() { status_line+=("$1"); }
# Seconds a step may take: its own limit or what is left before DEADLINE.
budget() {
  local left=$((DEADLINE - (SECONDS - started) - 10))
  echo $((left < $1 ? (left > 1 ? left : 1) : $1))
}
