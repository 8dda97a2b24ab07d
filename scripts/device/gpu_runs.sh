#!/usr/bin/env bash
# The `dtrain train` part of scripts/device/gpu_check.sh (issue 23): end-to-end
# runs on CUDA, the throughput benchmark, two ranks sharing the GPU through
# Gloo, and the largest model FSDP trains at one rank. gpu_check.sh sources
# this file and calls gpu_runs_main after the CUDA tests, and gpu_runs_finish
# as it ends; every run goes through train_run, which gives it at most what
# is left before DEADLINE and records it, ok or not, in $WORK/runs.jsonl.
#
# Phases, in this order (GPU_RUNS_PHASES, default all of them), with the
# seconds each is expected to take on the H200 (a run: ~5 s of start, CUDA
# and the model's construction, then its steps). When time is short the later
# ones are dropped: a run reached with less than its NEED seconds left is
# recorded as NO-TIME-LEFT and named in the summary line and the page.
#   e2e        ~60 s, 8 runs of a small GPT (4 layers, width 256, context
#              256, 20 steps): single, then --resume; ddp and fsdp (bf16) at
#              1 rank (NCCL) and 2 ranks (Gloo), with --checkpoint-dir and
#              --checkpoint-every 10, --resume to 30 steps, --trace (then
#              `dtrain trace summary`), --tf32 off once, --peak-tflops 0 once
#   fp8        ~200 s (issue 41): `dtrain bench fp8`, one linear layer in bf16,
#              tensorwise and rowwise over shapes (what --fp8-min-width rests
#              on); the 1.21B GPT of bench-1.3b, fsdp bf16 at 1 rank, 100
#              steps each of --fp8 off, tensorwise, rowwise (tokens/s and the
#              last 10 steps' loss side by side); a Llama of Llama 3 8B's
#              layer shapes (4 layers of width 4096, 32 heads, 8 key/value
#              heads, SwiGLU 14336) with activation checkpointing, 10 steps
#              of off and tensorwise; 2 ranks on the one GPU (Gloo), the small
#              GPT in fp8 with --fp8-all-gather on and off (equal losses: the
#              float8 all-gather trains bitwise as the plain one)
#   bench-1.3b ~75 s: GPT 24 layers, width 2048, 16 heads (1.21B), context
#              1024, batch 16, bf16, AdamW, 10 steps: first the plain-LibTorch
#              baseline (bench_gpt_cuda: the same GPT, dtrain's bf16 policy
#              and AdamW, 2 untimed + 8 timed steps; skipped when not built,
#              e.g. DTRAIN_GPU_BENCH=0), then dtrain train --strategy single,
#              ddp, fsdp (Full), zero2 (GradOp), --fsdp-prefetch on
#   bench-350m ~60 s: as bench-1.3b at width 1024 (0.30B), batch 32, then
#              dtrain single once more with --trace (where a step's time goes)
#   bench-llama-1b ~75 s: as bench-1.3b on a Llama of Llama 3.2 1B's shape
#              (16 layers, width 2048, 32 heads, 8 key/value heads, SwiGLU
#              8192; 0.97B), batch 16
#   overlap    ~30-45 s: 2 ranks on the one GPU (Gloo), GPT 12 x 768, batch
#              8, 8 steps, traced: fsdp, fsdp without separate streams (where
#              a flag turns them off), ddp
#   largest    ~60-170 s: the largest GPT of width 4096 (32 heads, context
#              1024, batch 2) that `dtrain plan --activation-checkpointing on`
#              puts under 92% of the GPU's memory, 4 steps of fsdp bf16 with
#              --activation-checkpointing on; on a failure (OOM) the next
#              smaller one, while time lasts
#   extra      ~20 s: zero1 at 1 rank, zero2 and hsdp at 2 ranks (small GPT)
# dtrain's GEMM probe (MFU's peak) runs in the first run and is cached in
# $WORK/cache (DTRAIN_CACHE_DIR) for the others, bench_gpt_cuda's included
# (its MFU is against the same peak).
#
# Results: $WORK (default $BUILD_DIR/gpu-runs) holds each run's NAME.jsonl
# (--metrics), NAME.log, NAME.trace-summary.json, the plans and the test
# reports; gpu_runs_finish writes $OUT/gpu_results.md (bench/gpu_report.py)
# and packs $WORK, less checkpoints and large traces, into
# $OUT/gpu_runs.tar.gz. Copy them into bench/results/gpu/ with
#   python3 bench/gpu_report.py table gpu_runs.tar.gz --md bench/results/gpu/README.md \
#     --json bench/results/gpu/h200-runs.json
#
# Settings (environment): GPU_RUNS_PHASES; DTRAIN_GPU_DEVICE (cuda; cpu: a
# dry run of every argument list at toy sizes, for a machine without a GPU);
# DTRAIN_GPU_MULTI_BACKEND (gloo: what DTRAIN_CUDA_BACKEND is set to for runs
# of several ranks); DTRAIN_GPU_STREAMS_OFF (the dtrain train flags that turn
# separate communication streams off, e.g. "--comm-streams off"; default: a
# --*stream* flag of dtrain train --help taking on|off, if there is one);
# LARGEST_FRACTION (0.92).
#
# Standalone, for the dry run on a CPU machine (no GPU, any build):
#   DTRAIN_GPU_DEVICE=cpu BUILD_DIR=build bash scripts/device/gpu_runs.sh

WORK=${WORK:-$BUILD_DIR/gpu-runs}
GPU_RUNS_PHASES=${GPU_RUNS_PHASES:-e2e fp8 bench-350m bench-1.3b bench-llama-1b overlap largest extra}
GPU_DEVICE=${DTRAIN_GPU_DEVICE:-cuda}
MULTI_BACKEND=${DTRAIN_GPU_MULTI_BACKEND:-gloo}
REPORTER=bench/gpu_report.py
work_ready=0
declare -A phase_total=() phase_ok=() phase_bad=() phase_keys=()

# The run folder, emptied once per script run (the test reports go there too).
work_init() {
  [ "$work_ready" = 1 ] && return 0
  rm -rf "$WORK"
  mkdir -p "$WORK"
  work_ready=1
}

has_flag() {  # has_flag HELP_TEXT --flag
  grep -qE -- "(^|[[:space:],])$2([[:space:],=]|$)" <<<"$1"
}

# One `dtrain train` run. train_run NAME PHASE NPROC NEED LIMIT [ARGS...]:
# skipped without NEED seconds left; at most LIMIT seconds; its metrics go to
# $WORK/NAME.jsonl; ok when it exits 0 and the metrics' last line is final
# (and, with --resume among ARGS, says it resumed).
train_run() {
  local name=$1 phase=$2 nproc=$3 need=$4 limit=$5
  shift 5
  local model_flag=(--model gpt)
  [[ " $* " == *" --model "* ]] && model_flag=()  # the run names its own (bench-llama-1b)
  local args=(train "${model_flag[@]}" --data "text:$corpus" --log-every 1 "${device_args[@]}"
    --nproc "$nproc" --backend c10d --metrics "$WORK/$name.jsonl" "$@")
  # DTRAIN_CACHE_DIR: dtrain's GEMM probe (the MFU's peak) runs once, in the first run, and its
  # result lands in $WORK/cache/peak_flops.json, which the tarball keeps.
  local backend=nccl envs=(DTRAIN_TIMEOUT=120 "DTRAIN_CACHE_DIR=$WORK/cache")
  if [ "$nproc" -gt 1 ]; then backend=$MULTI_BACKEND; envs+=(DTRAIN_CUDA_BACKEND="$MULTI_BACKEND"); fi
  [ "$GPU_DEVICE" = cpu ] && backend=gloo
  phase_total[$phase]=$((${phase_total[$phase]:-0} + 1))
  if [ "$(budget "$need")" -lt "$need" ]; then
    echo "--- $name: skipped, less than ${need}s left"
    phase_bad[$phase]+=" $name:NO-TIME-LEFT"
    "$PYTHON" "$REPORTER" record "$WORK" --name "$name" --phase "$phase" --nproc "$nproc" --status NO-TIME-LEFT \
      --rc 0 --seconds 0 --backend "$backend" -- "${args[@]}"
    return 1
  fi
  step "train $name ($nproc rank(s), $backend): dtrain ${args[*]}"
  local t0=$SECONDS
  env "${envs[@]}" timeout -k 5 "$(budget "$limit")" "$DTRAIN" "${args[@]}" >"$WORK/$name.log" 2>&1 </dev/null
  local rc=$? seconds=$((SECONDS - t0))
  tail -n 15 "$WORK/$name.log"
  local status=ok resumed=() trace='' prev='' arg
  for arg in "$@"; do
    [ "$arg" = --resume ] && resumed=(--resumed)
    [ "$prev" = --trace ] && trace=$arg
    prev=$arg
  done
  "$PYTHON" "$REPORTER" check "$WORK/$name.jsonl" "${resumed[@]}"
  local check=$?
  if [ "$rc" != 0 ]; then
    status="FAIL($rc)"
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && status="TIMEOUT"
    grep -qiE "out of memory|CUDA_ERROR_OUT_OF_MEMORY|OutOfMemory" "$WORK/$name.log" && status=OOM
  elif [ "$check" = 1 ]; then
    status=NO-FINAL
  fi
  if [ -n "$trace" ] && [ -f "$trace" ]; then
    timeout 60 "$DTRAIN" trace summary "$trace"
    timeout 60 "$DTRAIN" trace summary --json "$trace" >"$WORK/$name.trace-summary.json" ||
      rm -f "$WORK/$name.trace-summary.json"
  fi
  "$PYTHON" "$REPORTER" record "$WORK" --name "$name" --phase "$phase" --nproc "$nproc" --status "$status" \
    --rc "$rc" --seconds "$seconds" --backend "$backend" -- "${args[@]}"
  if [ "$status" = ok ]; then
    phase_ok[$phase]=$((${phase_ok[$phase]:-0} + 1))
    [ "$check" = 2 ] && phase_keys[$phase]=$((${phase_keys[$phase]:-0} + 1))
    return 0
  fi
  phase_bad[$phase]+=" $name:$status"
  return 1
}

# The phase's verdict for the summary line, e.g. e2e=7/8(e2e-ddp-np2:FAIL(1)):
# runs ok of runs, then those not ok and how many ok runs lack a metrics key
# of issue 23 (mfu, peak_tflops, cuda_*_peak_bytes, the final line's device).
phase_note() {
  local phase=$1
  [ -n "${phase_total[$phase]:-}" ] || return 0
  local bad=${phase_bad[$phase]:-}
  [ -n "${phase_keys[$phase]:-}" ] && bad+=" keys-missing-in-${phase_keys[$phase]}"
  note "$phase=${phase_ok[$phase]:-0}/${phase_total[$phase]}${bad:+(${bad# })}"
}

gpu_runs_setup() {
  work_init
  DTRAIN=$BUILD_DIR/bin/dtrain
  step "dtrain train runs: setup ($GPU_RUNS_PHASES)"
  if [ ! -x "$DTRAIN" ]; then echo "no $DTRAIN"; note "train=NOT-BUILT"; return 1; fi
  train_help=$("$DTRAIN" train --help 2>&1)
  plan_help=$("$DTRAIN" plan --help 2>&1)
  if has_flag "$train_help" --device; then
    device_args=(--device "$GPU_DEVICE")
  elif [ "$GPU_DEVICE" = cpu ]; then
    device_args=()
  else
    echo "dtrain train has no --device: nothing to run on the GPU"
    note "train=NO-DEVICE-FLAG"
    return 1
  fi
  # bf16 for single and ddp once dtrain train takes it (issue 23); fp32 before.
  mp_sd=bf16
  if grep -q "single and ddp: none" <<<"$train_help"; then
    mp_sd=none
    echo "dtrain train --mixed-precision is for sharded strategies only: single and ddp run fp32"
  fi
  for flag in --device --tf32 --peak-tflops --activation-checkpointing; do
    has_flag "$train_help" "$flag" && echo "dtrain train $flag: yes" || echo "dtrain train $flag: MISSING"
  done
  has_flag "$plan_help" --activation-checkpointing && echo "dtrain plan --activation-checkpointing: yes" ||
    echo "dtrain plan --activation-checkpointing: MISSING"
  # A text corpus of about 4 MiB from the repository's own documents.
  corpus=$WORK/corpus.txt
  : >"$corpus"
  while [ "$(stat -c %s "$corpus")" -lt 4000000 ]; do cat README.md docs/*.md >>"$corpus"; done
  echo "corpus: $corpus, $(stat -c %s "$corpus") bytes"
  {
    # The kit records the commit it was made from (make_kit.sh): the copy
    # here may sit inside another repository, whose HEAD git would report.
    echo "commit: $(cat "$repo/.devkit/commit" 2>/dev/null || echo unknown)"
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    command -v nvidia-smi >/dev/null &&
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/gpu: /'
    "$PYTHON" -c 'import torch; print("torch:", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null
    echo "cores: $(nproc)"
  } >"$WORK/machine.txt"
  cat "$WORK/machine.txt"
  return 0
}

# Shapes: the GPU's, or toys for the CPU dry run.
shape() {  # shape NAME: fills the array `model`
  if [ "$GPU_DEVICE" = cpu ]; then
    model=(--gpt-layers 2 --gpt-dim 64 --gpt-heads 2 --seq-len 64 --batch-size 4)
    [ "$1" = llama-1b ] && model=(--model llama --gpt-layers 2 --gpt-dim 64 --gpt-heads 4 --kv-heads 2 --ffn-dim 128
                                  --seq-len 64 --batch-size 4)
    return
  fi
  case $1 in
    small) model=(--gpt-layers 4 --gpt-dim 256 --gpt-heads 4 --seq-len 256 --batch-size 16) ;;
    350m) model=(--gpt-layers 24 --gpt-dim 1024 --gpt-heads 16 --seq-len 1024 --batch-size 32) ;;
    1.3b) model=(--gpt-layers 24 --gpt-dim 2048 --gpt-heads 16 --seq-len 1024 --batch-size 16) ;;
    overlap) model=(--gpt-layers 12 --gpt-dim 768 --gpt-heads 12 --seq-len 1024 --batch-size 8) ;;
    # Llama 3.2 1B's shape (grouped-query attention: 32 query heads, 8 key/value
    # heads; SwiGLU 8192) at the byte-level vocabulary: 0.97B parameters.
    # Llama 3 8B's layers (width 4096, 32 heads, 8 key/value heads, SwiGLU
    # 14336), 4 of them: the GEMM shapes of an 8B model on one GPU.
    llama-8b-layers) model=(--model llama --gpt-layers 4 --gpt-dim 4096 --gpt-heads 32 --kv-heads 8 --ffn-dim 14336
                            --seq-len 1024 --batch-size 8) ;;
    llama-1b) model=(--model llama --gpt-layers 16 --gpt-dim 2048 --gpt-heads 32 --kv-heads 8 --ffn-dim 8192
                     --seq-len 1024 --batch-size 16) ;;
  esac
}

phase_e2e() {
  local model s=20 r=30
  [ "$GPU_DEVICE" = cpu ] && s=4 r=6
  shape small
  local quiet=(--eval-windows 8 --samples 0) ck=$WORK/ck
  local tf32_off=() probe=()
  has_flag "$train_help" --tf32 && tf32_off=(--tf32 off)
  has_flag "$train_help" --peak-tflops && probe=(--peak-tflops 0)
  # single: progress, samples, checkpoints, the GEMM probe (--peak-tflops 0: measure); then resume.
  train_run e2e-single e2e 1 20 90 "${model[@]}" --strategy single --mixed-precision "$mp_sd" --steps $s \
    --eval-windows 8 --checkpoint-dir "$ck-single" --checkpoint-every $((s / 2)) "${probe[@]}"
  train_run e2e-single-resume e2e 1 20 90 "${model[@]}" --strategy single --mixed-precision "$mp_sd" --steps $r \
    "${quiet[@]}" --checkpoint-dir "$ck-single" --checkpoint-every $((s / 2)) --resume
  train_run e2e-ddp-np1 e2e 1 20 90 "${model[@]}" --strategy ddp --mixed-precision "$mp_sd" --steps $s \
    "${quiet[@]}" --trace "$WORK/e2e-ddp-np1.trace.json" "${tf32_off[@]}"
  train_run e2e-fsdp-np1 e2e 1 20 90 "${model[@]}" --strategy fsdp --mixed-precision bf16 --steps $s \
    "${quiet[@]}" --checkpoint-dir "$ck-fsdp1" --checkpoint-every $((s / 2)) --trace "$WORK/e2e-fsdp-np1.trace.json"
  train_run e2e-fsdp-np1-resume e2e 1 20 90 "${model[@]}" --strategy fsdp --mixed-precision bf16 --steps $r \
    "${quiet[@]}" --checkpoint-dir "$ck-fsdp1" --checkpoint-every $((s / 2)) --resume
  train_run e2e-ddp-np2 e2e 2 25 90 "${model[@]}" --strategy ddp --mixed-precision "$mp_sd" --steps $s \
    "${quiet[@]}" --trace "$WORK/e2e-ddp-np2.trace.json"
  train_run e2e-fsdp-np2 e2e 2 25 90 "${model[@]}" --strategy fsdp --mixed-precision bf16 --steps $s \
    "${quiet[@]}" --checkpoint-dir "$ck-fsdp2" --checkpoint-every $((s / 2)) --trace "$WORK/e2e-fsdp-np2.trace.json"
  train_run e2e-fsdp-np2-resume e2e 2 25 90 "${model[@]}" --strategy fsdp --mixed-precision bf16 --steps $r \
    "${quiet[@]}" --checkpoint-dir "$ck-fsdp2" --checkpoint-every $((s / 2)) --resume
  phase_note e2e
}

# The plain-LibTorch baseline (tests/cuda/bench_gpt_cuda.cpp) of a bench
# phase: baseline_run NAME PHASE NEED LIMIT [ARGS...], as train_run: skipped
# without NEED seconds left, at most LIMIT seconds, recorded in runs.jsonl
# (program bench_gpt_cuda); its JSON line goes to $WORK/NAME.jsonl, its
# output to $WORK/NAME.log and $OUT/bench.txt. Not built by this gpu_check
# run: recorded NOT-BUILT; DTRAIN_GPU_BENCH=0: left out.
bench_txt_ready=0
baseline_run() {
  local name=$1 phase=$2 need=$3 limit=$4
  shift 4
  [ "${DTRAIN_GPU_BENCH:-1}" != 0 ] || return 0
  local program=$BUILD_DIR/bin/bench_gpt_cuda marker=$BUILD_DIR/.gpu_check_build_started
  local args=("$@" --device "$GPU_DEVICE") status=ok rc=0 seconds=0
  [ "$bench_txt_ready" = 1 ] || { rm -f "$OUT/bench.txt"; bench_txt_ready=1; }
  phase_total[$phase]=$((${phase_total[$phase]:-0} + 1))
  if [ ! -x "$program" ] || { [ -f "$marker" ] && [ ! "$program" -nt "$marker" ]; }; then
    echo "--- $name: $program was not built by this run"
    status=NOT-BUILT
  elif [ "$(budget "$need")" -lt "$need" ]; then
    echo "--- $name: skipped, less than ${need}s left"
    status=NO-TIME-LEFT
  else
    step "baseline $name (plain LibTorch): bench_gpt_cuda ${args[*]}"
    local t0=$SECONDS
    env "DTRAIN_CACHE_DIR=$WORK/cache" timeout -k 5 "$(budget "$limit")" "$program" "${args[@]}" >"$WORK/$name.log" 2>&1 </dev/null
    rc=$? seconds=$((SECONDS - t0))
    tail -n 5 "$WORK/$name.log"
    tee -a "$OUT/bench.txt" <"$WORK/$name.log" >/dev/null
    grep '^{"bench":"bench_gpt_cuda"' "$WORK/$name.log" | tail -n 1 >"$WORK/$name.jsonl"
    if [ "$rc" = 77 ]; then status=SKIPPED-NO-GPU
    elif [ "$rc" != 0 ]; then
      status="FAIL($rc)"
      [ "$rc" = 124 ] || [ "$rc" = 137 ] && status=TIMEOUT
      grep -qiE "out of memory|CUDA_ERROR_OUT_OF_MEMORY|OutOfMemory" "$WORK/$name.log" && status=OOM
    elif [ ! -s "$WORK/$name.jsonl" ]; then status=NO-RESULT
    fi
  fi
  "$PYTHON" "$REPORTER" record "$WORK" --name "$name" --phase "$phase" --nproc 1 --status "$status" --rc "$rc" \
    --seconds "$seconds" --program bench_gpt_cuda -- bench_gpt_cuda "${args[@]}"
  if [ "$status" = ok ]; then phase_ok[$phase]=$((${phase_ok[$phase]:-0} + 1)); return 0; fi
  phase_bad[$phase]+=" $name:$status"
  return 1
}

# Plain LibTorch, then dtrain train single, ddp, fsdp (FSDP Full), zero2
# (FSDP GradOp): the same GPT, batch and steps (the baseline times the 8
# steps after 2 untimed ones, as the page takes dtrain's medians).
# dtrain plan's predicted step beside a bench run's measured one (issue 40):
# one rank, so no link is timed; the GEMM rate is the run's own MFU peak (the
# probe it cached), the memory bandwidth $DTRAIN_GPU_HBM_GBPS (default 4800,
# an H200's HBM3e). Writes $WORK/NAME.plan.json and a line to $OUT/bench.txt.
plan_prediction() {  # plan_prediction NAME PLAN-FLAGS...
  local name=$1
  shift
  local model_flag=(--model gpt)
  [[ " $* " == *" --model "* ]] && model_flag=()
  local peak
  peak=$("$PYTHON" -c 'import json,sys
lines=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
final=[l for l in lines if l.get("final")]
print(final[-1].get("peak_tflops") or "" if final else "")' "$WORK/$name.jsonl" 2>/dev/null)
  local rates=()
  if [ -n "$peak" ] && [ "$peak" != 0.0 ] && [ "$peak" != 0 ]; then
    rates=(--gemm-gflops "$("$PYTHON" -c 'import sys; print(float(sys.argv[1]) * 1000)' "$peak")"
           --memory-gbps "${DTRAIN_GPU_HBM_GBPS:-4800}")
  elif [ "$GPU_DEVICE" != cpu ]; then
    echo "--- $name: no measured peak, no prediction"
    return 0
  fi  # the CPU dry run: dtrain plan's own probes of this machine
  step "predicted step of $name: dtrain plan ${model_flag[*]} $* --nproc 1 ${rates[*]}"
  timeout 60 "$DTRAIN" plan "${model_flag[@]}" "$@" --nproc 1 --link 10,100 "${rates[@]}" \
    --json >"$WORK/$name.plan.json" 2>&1 || {
    echo "--- $name: dtrain plan failed: $(tail -n 2 "$WORK/$name.plan.json")"
    return 0
  }
  "$PYTHON" -c 'import json,sys
plan=json.load(open(sys.argv[1]))
final=[json.loads(l) for l in open(sys.argv[2]) if l.strip() and json.loads(l).get("final")][-1]
predicted, measured = plan["time"]["seconds"], final["step_time_s_median"]
print("%s: predicted step %.1f ms, measured median %.1f ms, measured / predicted %.3f" %
      (sys.argv[3], predicted * 1e3, measured * 1e3, measured / predicted))' \
    "$WORK/$name.plan.json" "$WORK/$name.jsonl" "$name" | tee -a "$OUT/bench.txt"
}

phase_bench() {  # phase_bench 350m|1.3b|llama-1b
  local size=$1 model steps=10 need=30 phase=bench-$1
  [ "$size" = 350m ] || need=40
  [ "$GPU_DEVICE" = cpu ] && steps=3
  shape "$size"
  baseline_run "bench-$size-plain" "$phase" "$need" 120 "${model[@]}" --mixed-precision bf16 --warmup-steps 2 \
    --steps $((steps - 2))
  if [ "$runs_ready" = 1 ]; then
    local common=("${model[@]}" --optimizer adamw --steps "$steps" --eval-windows 2 --samples 0)
    train_run "bench-$size-single" "$phase" 1 "$need" 120 "${common[@]}" --strategy single --mixed-precision "$mp_sd"
    train_run "bench-$size-ddp" "$phase" 1 "$need" 120 "${common[@]}" --strategy ddp --mixed-precision "$mp_sd"
    local strategy
    for strategy in fsdp zero2; do
      train_run "bench-$size-$strategy" "$phase" 1 "$need" 120 "${common[@]}" --strategy $strategy --mixed-precision bf16 \
        --fsdp-prefetch on
    done
    has_flag "$plan_help" --gemm-gflops &&
      plan_prediction "bench-$size-fsdp" "${model[@]}" --optimizer adamw --strategy fsdp --mixed-precision bf16
    # Where a step's time goes, when the untraced runs above fall short of
    # plain LibTorch: dtrain single again with --trace (host and device spans;
    # not in the table, whose runs are untraced).
    if [ "$size" = 350m ]; then
      train_run "trace-$size-single" trace 1 "$need" 120 "${common[@]}" --strategy single --mixed-precision "$mp_sd" \
        --trace "$WORK/trace-$size-single.trace.json"
      phase_note trace
    fi
  fi
  phase_note "$phase"
}

# fp8 runs side by side (phase_fp8): tokens/s after the first 3 steps and the
# mean loss of the last 10 steps, each against the first run named; a line
# each to $OUT/bench.txt.
fp8_compare() {  # fp8_compare BASE OTHER...
  "$PYTHON" -c 'import json,os,statistics,sys
work, names = sys.argv[1], sys.argv[2:]
def read(name):
    path = os.path.join(work, name + ".jsonl")
    if not os.path.exists(path): return None
    rows = [json.loads(l) for l in open(path) if l.strip()]
    steps = [r for r in rows if "step" in r and "loss" in r and not r.get("final")]
    if len(steps) < 4: return None
    rate = [k for k in steps[-1] if k.endswith("_per_s")][0]
    return statistics.median(r[rate] for r in steps[3:]), statistics.mean(r["loss"] for r in steps[-10:])
base = read(names[0])
for name in names[1:]:
    other = read(name)
    if base is None or other is None: print("%s: no result next to %s" % (name, names[0])); continue
    print("%s: %.3fx the tokens/s of %s; last-10-step loss %.4f vs %.4f (%+.2f%%)" %
          (name, other[0] / base[0], names[0], other[1], base[1], 100 * (other[1] - base[1]) / base[1]))'     "$WORK" "$@" | tee -a "$OUT/bench.txt"
}

phase_fp8() {
  local model steps=100 short=10 width=()
  if ! has_flag "$train_help" --fp8; then note "fp8=NO-FP8-FLAG"; return 0; fi
  local sweep=(--device "$GPU_DEVICE" --json "$WORK/fp8-sweep.json")
  if [ "$GPU_DEVICE" = cpu ]; then
    steps=6 short=4 width=(--fp8-min-width 0)  # the toy shapes are below the GPU's rule
    sweep+=(--tokens 64 --shapes 64x64,128x256 --repeats 2)
  fi
  step "one linear layer in bf16 and fp8: dtrain bench fp8 ${sweep[*]}"
  timeout "$(budget 60)" "$DTRAIN" bench fp8 "${sweep[@]}" 2>&1 | tee "$WORK/fp8-sweep.log" | tee -a "$OUT/bench.txt"
  shape 1.3b
  local common=("${model[@]}" --optimizer adamw --eval-windows 2 --samples 0 --strategy fsdp --mixed-precision bf16
                --fsdp-prefetch on "${width[@]}")
  local f
  for f in off tensorwise rowwise; do
    train_run "fp8-1.3b-$f" fp8 1 45 150 "${common[@]}" --steps $steps --fp8 $f
  done
  fp8_compare fp8-1.3b-off fp8-1.3b-tensorwise fp8-1.3b-rowwise
  shape llama-8b-layers
  common=("${model[@]}" --optimizer adamw --eval-windows 1 --samples 0 --strategy fsdp --mixed-precision bf16
          --fsdp-prefetch on --activation-checkpointing on "${width[@]}")
  for f in off tensorwise; do
    train_run "fp8-8b-layers-$f" fp8 1 45 120 "${common[@]}" --steps $short --fp8 $f
  done
  fp8_compare fp8-8b-layers-off fp8-8b-layers-tensorwise
  shape small
  common=("${model[@]}" --eval-windows 2 --samples 0 --strategy fsdp --mixed-precision bf16 --fp8 tensorwise
          --fp8-min-width 0 --steps $short)
  train_run fp8-np2-gather-on fp8 2 25 90 "${common[@]}" --fp8-all-gather on
  train_run fp8-np2-gather-off fp8 2 25 90 "${common[@]}" --fp8-all-gather off
  "$PYTHON" -c 'import json,sys
def losses(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return [r["loss"] for r in rows if "step" in r and "loss" in r and not r.get("final")]
on, off = losses(sys.argv[1]), losses(sys.argv[2])
gap = max((abs(a - b) for a, b in zip(on, off)), default=float("nan"))
# CUDA kernels (atomics in the embedding backward) need not repeat bitwise: the gap is reported, not judged.
print("fp8 all-gather on 2 ranks: %d steps, largest loss difference from the plain gather %.3g%s" %
      (len(on), gap, " (bitwise equal)" if on == off and on else ""))' \
    "$WORK/fp8-np2-gather-on.jsonl" "$WORK/fp8-np2-gather-off.jsonl" 2>&1 | tee -a "$OUT/bench.txt"
  phase_note fp8
}

phase_overlap() {
  local model
  shape overlap
  local steps=8
  [ "$GPU_DEVICE" = cpu ] && steps=3
  local common=("${model[@]}" --steps "$steps" --eval-windows 2 --samples 0)
  local off=()
  if [ -n "${DTRAIN_GPU_STREAMS_OFF:-}" ]; then
    read -r -a off <<<"$DTRAIN_GPU_STREAMS_OFF"
  else
    local flag
    flag=$(grep -oE -- "--[a-z0-9-]*stream[a-z0-9-]*" <<<"$train_help" | head -n 1)
    if [ -n "$flag" ] && grep -E -- "$flag" <<<"$train_help" | grep -qE "on[|,]off|off[|,]on"; then off=("$flag" off); fi
  fi
  train_run overlap-fsdp-np2 overlap 2 40 120 "${common[@]}" --strategy fsdp --mixed-precision bf16 --fsdp-prefetch on \
    --trace "$WORK/overlap-fsdp-np2.trace.json"
  if [ ${#off[@]} -gt 0 ]; then
    train_run overlap-fsdp-np2-nostreams overlap 2 40 120 "${common[@]}" --strategy fsdp --mixed-precision bf16 \
      --fsdp-prefetch on --trace "$WORK/overlap-fsdp-np2-nostreams.trace.json" "${off[@]}"
  else
    echo "--- no dtrain train flag turns the separate streams off: the run without them is left out"
    note "overlap-nostreams=NO-FLAG"
  fi
  train_run overlap-ddp-np2 overlap 2 40 120 "${common[@]}" --strategy ddp --mixed-precision "$mp_sd" \
    --trace "$WORK/overlap-ddp-np2.trace.json"
  phase_note overlap
}

phase_largest() {
  # Activation checkpointing on, in the plan and in the run: each block keeps
  # only its input until its backward recomputes it (dtrain train and dtrain
  # plan --activation-checkpointing on|off).
  local ac=(--activation-checkpointing on) layers dim=4096 heads=32 seq=1024 batch=2 steps=4
  if ! has_flag "$train_help" --activation-checkpointing || ! has_flag "$plan_help" --activation-checkpointing; then
    echo "dtrain train or dtrain plan has no --activation-checkpointing: the largest model is not run"
    note "largest=NO-ACTIVATION-CHECKPOINTING-FLAG"
    return 0
  fi
  local candidates=(48 44 40 36 32 28 24 20 16) memory_mib
  memory_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1)
  if [ "$GPU_DEVICE" = cpu ]; then
    dim=64 heads=2 seq=64 batch=2 steps=2 candidates=(8 4 2) memory_mib=4
  fi
  if [ -z "$memory_mib" ]; then note "largest=NO-GPU-MEMORY"; return 0; fi
  local limit
  limit=$("$PYTHON" -c "print(int($memory_mib * 1048576 * ${LARGEST_FRACTION:-0.92}))")
  step "largest model with activation checkpointing: dtrain plan ${ac[*]} for width $dim, batch $batch, under $limit bytes"
  local fits=() predicted
  for layers in "${candidates[@]}"; do
    [ ${#fits[@]} -ge 2 ] && break  # the largest that fits and one smaller are all that can run
    timeout 30 "$DTRAIN" plan --model gpt --gpt-layers "$layers" --gpt-dim $dim --gpt-heads $heads --seq-len $seq \
      --nproc 1 --batch-size $batch --mixed-precision bf16 --strategy fsdp "${ac[@]}" --json \
      >"$WORK/plan-L$layers.json" 2>&1
    predicted=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["peak_bytes"])' "$WORK/plan-L$layers.json" 2>/dev/null)
    echo "L$layers x $dim, activation checkpointing: plan predicts ${predicted:-?} bytes"
    [ -n "$predicted" ] && [ "$predicted" -le "$limit" ] && fits+=("$layers")
  done
  local tried=0
  for layers in "${fits[@]}"; do
    [ $tried -ge 2 ] && break  # the largest that fits, then at most one smaller
    tried=$((tried + 1))
    cp "$WORK/plan-L$layers.json" "$WORK/largest-L$layers.plan.json"
    if train_run "largest-L$layers" largest 1 90 170 --gpt-layers "$layers" --gpt-dim $dim --gpt-heads $heads \
      --seq-len $seq --batch-size $batch --steps $steps --strategy fsdp --mixed-precision bf16 --fsdp-prefetch on \
      --eval-windows 1 --samples 0 "${ac[@]}"; then
      break
    fi
  done
  phase_note largest
}

phase_extra() {
  local model s=10
  [ "$GPU_DEVICE" = cpu ] && s=3
  shape small
  local common=("${model[@]}" --steps "$s" --eval-windows 4 --samples 0 --mixed-precision bf16)
  train_run extra-zero1-np1 extra 1 20 60 "${common[@]}" --strategy zero1
  train_run extra-zero2-np2 extra 2 25 60 "${common[@]}" --strategy zero2
  train_run extra-hsdp-np2 extra 2 25 60 "${common[@]}" --strategy hsdp
  phase_note extra
}

gpu_runs_main() {
  local phase
  runs_ready=1
  gpu_runs_setup || runs_ready=0
  for phase in $GPU_RUNS_PHASES; do
    # Without a dtrain train that runs on the GPU only the bench phases' plain-LibTorch baselines are left.
    [ "$runs_ready" = 1 ] || [[ $phase == bench-* ]] || continue
    case $phase in
      e2e) phase_e2e ;;
      fp8) phase_fp8 ;;
      bench-1.3b) phase_bench 1.3b ;;
      bench-350m) phase_bench 350m ;;
      bench-llama-1b) phase_bench llama-1b ;;
      probe) echo "probe: now the bench phases' plain-LibTorch baselines (bench_gpt_cuda)" ;;
      overlap) phase_overlap ;;
      largest) phase_largest ;;
      extra) phase_extra ;;
      *) echo "unknown phase $phase" ;;
    esac
  done
}

# As the script ends (its EXIT trap): the markdown page and the tarball, both in $OUT.
gpu_runs_finish() {
  [ "$work_ready" = 1 ] && [ -d "$WORK" ] || return 0
  local file
  for file in bench.txt summary.txt; do [ -f "$OUT/$file" ] && cp "$OUT/$file" "$WORK/$file"; done
  timeout 30 "$PYTHON" "$REPORTER" table "$WORK" --md "$OUT/gpu_results.md" --json "$WORK/gpu_results.json" ||
    echo "gpu_report failed"
  # Everything but checkpoints and the corpus; traces up to 4 MiB each.
  local parent name
  parent=$(dirname "$WORK") name=$(basename "$WORK")
  (cd "$parent" && find "$name" -type f ! -path "*/ck-*" ! -name corpus.txt \( ! -name "*.trace.json" -o -size -4M \) |
    sort) >"$WORK.files"
  tar -czf "$OUT/gpu_runs.tar.gz" -C "$parent" -T "$WORK.files"
  if [ "$(stat -c %s "$OUT/gpu_runs.tar.gz" 2>/dev/null || echo 0)" -gt 15000000 ]; then
    grep -v '\.trace\.json$' "$WORK.files" >"$WORK.files.small"
    tar -czf "$OUT/gpu_runs.tar.gz" -C "$parent" -T "$WORK.files.small"
  fi
  echo "results: $OUT/gpu_results.md, $OUT/gpu_runs.tar.gz ($(stat -c %s "$OUT/gpu_runs.tar.gz" 2>/dev/null) bytes)"
}

# Standalone: the dry run (or the runs alone on a GPU machine with a build).
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -uo pipefail
  repo=$(cd "$(dirname "$0")/../.." && pwd)
  cd "$repo" || exit 1
  BUILD_DIR=${BUILD_DIR:-build}
  OUT=${OUT:-/tmp/gpu_runs_out}
  DEADLINE=${DEADLINE:-560}
  PYTHON=${PYTHON:-$(command -v python3)}
  WORK=${WORK_DRY:-/tmp/gpu_runs_work}
  mkdir -p "$OUT"
  started=$SECONDS
  status_line=()
  . "$repo/scripts/device/step_budget.sh"
  gpu_runs_main
  echo "gpu_runs: ${status_line[*]:-nothing ran} ($((SECONDS - started))s)" >"$OUT/summary.txt"
  gpu_runs_finish
  cat "$OUT/summary.txt"
fi
