"""The GPU check's runs (scripts/device/gpu_check.sh, issue 23) as one markdown page.

    gpu_report.py check METRICS [--resumed]     one run's metrics file: exit 0 when its last line
                                                has "final": true (2: final, but a key issue 23 adds
                                                is missing; 1: no final line or not JSON Lines)
    gpu_report.py peak METRICS                  the run's peak_tflops (nothing when it has none)
    gpu_report.py record WORK --name N --phase P --status S [--nproc N --rc RC --seconds S --backend B
                         --program dtrain|bench_gpt_cuda] -- ARGS
                                                append one run to WORK/runs.jsonl (the script's manifest)
    gpu_report.py table RUNS [--md PATH] [--json PATH] [--title TEXT]
                                                RUNS: the script's run folder, or the gpu_runs.tar.gz
                                                that comes back in $OUT; writes the page (stdout
                                                without --md) and, with --json, the rows
    gpu_report.py selftest                      the above on synthetic files in a temporary folder

gpu_check.sh records every `dtrain train` it runs in WORK/runs.jsonl (name, phase, ranks, exit
status, seconds, the arguments) beside each run's --metrics file NAME.jsonl, its output NAME.log
and, for traced runs, `dtrain trace summary --json` in NAME.trace-summary.json. Metrics lines:
step lines carry tokens_per_s and (issue 23) mfu, peak_tflops, cuda_allocated_peak_bytes and
cuda_reserved_peak_bytes; the final line has "final": true and (issue 23) device. Speeds are
medians over the steps after the first two (warm-up), as bench/train_run.py takes them.
The bench phases' plain-LibTorch baseline (program bench_gpt_cuda, tests/cuda/bench_gpt_cuda.cpp)
leaves one JSON line ({"bench": "bench_gpt_cuda", ...}: tokens_per_s and step_time_s of its median
timed step, mfu, peak_tflops, the CUDA peaks) in NAME.jsonl; each dtrain run's tokens/s is shown
as a fraction of it ("vs plain LibTorch").
Standard library only.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tarfile
import tempfile

STEP_KEYS = ("tokens_per_s", "mfu", "peak_tflops", "cuda_allocated_peak_bytes", "cuda_reserved_peak_bytes")
FINAL_KEYS = ("device",)
GIB = float(1 << 30)
# Bench labels: the strategy of `dtrain train` and what the table calls it.
LABELS = {
    "single": "dtrain single (no wrapper)",
    "ddp": "dtrain DDP",
    "fsdp": "dtrain FSDP Full",
    "zero2": "dtrain FSDP GradOp (zero2)",
    "zero1": "dtrain zero1",
    "hsdp": "dtrain HSDP",
}
PLAIN = "bench_gpt_cuda"
PLAIN_LABEL = "plain LibTorch (bench_gpt_cuda)"
# The targets: dtrain FSDP Full at least this fraction of plain LibTorch's tokens/s (same
# precision policy), and at least this MFU at 1.3B.
TARGET_RATIO = 0.95  # FSDP Full / plain LibTorch
TARGET_TRAINER_RATIO = 0.98  # single and DDP / plain LibTorch (issue 36)
TARGET_MFU = 0.40


class InputError(Exception):
    pass


# --- one metrics file -----------------------------------------------------------------------

def read_metrics(path):
    """(step records, final record or None, other records); InputError when not JSON Lines."""
    steps, others, final = [], [], None
    try:
        with open(path) as f:
            lines = [line for line in f if line.strip()]
    except OSError as e:
        raise InputError("cannot read %s: %s" % (path, e))
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError("%s:%d is not JSON (%s)" % (path, n, e))
        if not isinstance(record, dict):
            raise InputError("%s:%d is not a JSON object" % (path, n))
        if record.get("final") is True:
            final = record if n == len(lines) else None  # only the last line ends a run
        elif "step_time_s" in record or "tokens_per_s" in record:
            steps.append(record)
        else:
            others.append(record)
    return steps, final, others


def number(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def timed(steps):
    """The steps after the first two (all of them when there are fewer than three)."""
    return steps[2:] if len(steps) > 2 else steps


def median_of(steps, key):
    values = [number(s.get(key)) for s in timed(steps)]
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def largest(value):
    """A number, or the largest of a per-rank list of them (dtrain writes the CUDA peaks per rank)."""
    if isinstance(value, list):
        values = [v for v in (number(x) for x in value) if v is not None]
        return max(values) if values else None
    return number(value)


def max_of(records, key):
    values = [largest(r.get(key)) for r in records]
    values = [v for v in values if v is not None]
    return max(values) if values else None


def missing_keys(steps, final):
    missing = [k for k in STEP_KEYS if steps and not any(k in s for s in steps)]
    missing += ["final." + k for k in FINAL_KEYS if final is not None and k not in final]
    return missing


def summarise(path):
    """What the tables show of one run's metrics file."""
    steps, final, others = read_metrics(path)
    # The step lines' medians; the final line's own (dtrain: of the median step) where they have none.
    mfu = median_of(steps, "mfu")
    if mfu is None and final:
        mfu = number(final.get("mfu"))
    if mfu is not None and mfu > 1.5:  # given in percent
        mfu /= 100.0
    peak = median_of(steps, "peak_tflops")
    if peak is None and final:
        peak = number(final.get("peak_tflops"))
    ends = steps + ([final] if final else [])
    resumed = final.get("resumed_from_step") if final else None
    if resumed is None:
        resumed = next((r["resumed_from_step"] for r in others if "resumed_from_step" in r), None)
    return {
        "final": final is not None,
        "steps_logged": len(steps),
        "steps": final.get("steps") if final else (steps[-1].get("step") if steps else None),
        "loss": final.get("loss") if final else (steps[-1].get("loss") if steps else None),
        "eval_loss": final.get("eval_loss") if final else None,
        "device": final.get("device") if final else None,
        "strategy": final.get("strategy") if final else None,
        "world_size": final.get("world_size") if final else None,
        "parameters": final.get("parameters") if final else None,
        "resumed_from_step": resumed,
        "step_time_s": median_of(steps, "step_time_s"),
        "tokens_per_s": median_of(steps, "tokens_per_s"),
        "mfu": mfu,
        "peak_tflops": peak,
        "cuda_allocated_peak_bytes": max_of(ends, "cuda_allocated_peak_bytes"),
        "cuda_reserved_peak_bytes": max_of(ends, "cuda_reserved_peak_bytes"),
        "peak_memory_bytes": final.get("peak_memory_bytes") if final else None,
        "missing_keys": missing_keys(steps, final),
    }


def summarise_baseline(path):
    """What the tables show of bench_gpt_cuda's result: its last {"bench": "bench_gpt_cuda"} line."""
    record = None
    try:
        with open(path) as f:
            for line in f:
                try:
                    value = json.loads(line)
                except json.JSONDecodeError:
                    continue  # its human line, or anything else around the JSON
                if isinstance(value, dict) and value.get("bench") == PLAIN:
                    record = value
    except OSError as e:
        raise InputError("cannot read %s: %s" % (path, e))
    if record is None:
        raise InputError("%s has no bench_gpt_cuda result line" % path)
    mfu = number(record.get("mfu"))
    return {
        "final": True,
        "steps_logged": record.get("steps"),
        "steps": record.get("steps"),
        "loss": record.get("loss"),
        "eval_loss": None,
        "device": record.get("device"),
        "strategy": "plain",
        "world_size": 1,
        "parameters": record.get("parameters"),
        "resumed_from_step": None,
        "step_time_s": number(record.get("step_time_s")),
        "tokens_per_s": number(record.get("tokens_per_s")),
        "mfu": mfu if mfu else None,
        "peak_tflops": number(record.get("peak_tflops")) or None,
        "cuda_allocated_peak_bytes": largest(record.get("cuda_allocated_peak_bytes")),
        "cuda_reserved_peak_bytes": largest(record.get("cuda_reserved_peak_bytes")),
        "peak_memory_bytes": None,
        "missing_keys": [k for k in STEP_KEYS if k not in record],
    }


def cmd_check(args):
    try:
        s = summarise(args.metrics)
    except InputError as e:
        print("metrics: %s" % e)
        return 1
    words = ["metrics: %s" % os.path.basename(args.metrics),
             "final=%s" % ("yes" if s["final"] else "NO"),
             "steps=%s" % s["steps"], "device=%s" % s["device"],
             "tokens/s=%s" % fmt(s["tokens_per_s"], "%.0f"),
             "mfu=%s" % pct(s["mfu"]), "peak_tflops=%s" % fmt(s["peak_tflops"], "%.1f"),
             "cuda_alloc_peak=%s" % gib(s["cuda_allocated_peak_bytes"]),
             "cuda_reserved_peak=%s" % gib(s["cuda_reserved_peak_bytes"])]
    if s["resumed_from_step"] is not None:
        words.append("resumed_from_step=%s" % s["resumed_from_step"])
    if s["missing_keys"]:
        words.append("MISSING-KEYS=%s" % ",".join(s["missing_keys"]))
    print(" ".join(words))
    if not s["final"]:
        return 1
    if args.resumed and not s["resumed_from_step"]:
        print("metrics: expected a resumed run (resumed_from_step > 0)")
        return 1
    return 2 if s["missing_keys"] else 0


def cmd_peak(args):
    try:
        s = summarise(args.metrics)
    except InputError:
        return 0
    if s["peak_tflops"]:
        print("%g" % s["peak_tflops"])
    return 0


def cmd_record(args):
    entry = {"name": args.name, "phase": args.phase, "nproc": args.nproc, "status": args.status,
             "rc": args.rc, "seconds": args.seconds, "backend": args.backend, "args": args.rest}
    if getattr(args, "program", "dtrain") != "dtrain":
        entry["program"] = args.program
    with open(os.path.join(args.work, "runs.jsonl"), "a") as f:
        f.write(json.dumps(entry) + "\n")
    return 0


# --- formatting -----------------------------------------------------------------------------

def fmt(value, pattern):
    return "–" if value is None else pattern % value


def thousands(value):
    return "–" if value is None else "{:,.0f}".format(value)


def pct(value):
    return "–" if value is None else "%.1f%%" % (100.0 * value)


def gib(value):
    return "–" if value is None else "%.2f GiB" % (value / GIB)


def table(header, rows):
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def arg_value(argv, flag, default=None):
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return default


def shape(argv):
    """'L24 d1024 h16 T1024 B32' from a run's arguments ('Llama L16 d2048 h32 kv8 ...' for a Llama)."""
    parts = [("L", "--gpt-layers"), ("d", "--gpt-dim"), ("h", "--gpt-heads"), ("kv", "--kv-heads"), ("T", "--seq-len"),
             ("B", "--batch-size")]
    words = [p + arg_value(argv, f) for p, f in parts if arg_value(argv, f) is not None]
    model = arg_value(argv, "--model", "gpt")
    return " ".join(([model.capitalize()] if model != "gpt" else []) + words)


def model_tflops(metrics):
    """The model's TFLOP/s by dtrain's one convention (train::model_flops_per_unit: 6 per
    matrix-product parameter per token plus attention's 12 L T C): MFU times the peak it is of."""
    mfu, peak = metrics.get("mfu"), metrics.get("peak_tflops")
    return mfu * peak if mfu and peak else None


# --- the page -------------------------------------------------------------------------------

def open_runs(path):
    """A folder with runs.jsonl; a .tar.gz is unpacked into a temporary folder first."""
    if os.path.isdir(path):
        return path, None
    if not tarfile.is_tarfile(path):
        raise InputError("%s is neither a folder nor a tar file" % path)
    tmp = tempfile.mkdtemp(prefix="gpu_report.")
    with tarfile.open(path) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and not os.path.isabs(m.name) and ".." not in m.name.split("/")]
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tmp, members=members, filter="data")
        else:
            tar.extractall(tmp, members=members)
    for root, _dirs, files in os.walk(tmp):
        if "runs.jsonl" in files:
            return root, tmp
    return tmp, tmp


def load_runs(folder):
    runs = []
    manifest = os.path.join(folder, "runs.jsonl")
    if os.path.exists(manifest):
        with open(manifest) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        runs.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise InputError("%s:%d is not JSON (%s)" % (manifest, n, e))
    for run in runs:
        metrics = os.path.join(folder, run["name"] + ".jsonl")
        run["metrics"] = None
        run["metrics_error"] = None
        if os.path.exists(metrics):
            try:
                run["metrics"] = summarise_baseline(metrics) if is_plain(run) else summarise(metrics)
            except InputError as e:
                run["metrics_error"] = str(e)
        trace = os.path.join(folder, run["name"] + ".trace-summary.json")
        run["trace"] = None
        if os.path.exists(trace):
            try:
                with open(trace) as f:
                    run["trace"] = json.load(f).get("ranks")
            except (json.JSONDecodeError, AttributeError):
                run["trace"] = None
        plan = os.path.join(folder, run["name"] + ".plan.json")
        run["plan"] = None
        if os.path.exists(plan):
            try:
                with open(plan) as f:
                    run["plan"] = json.load(f)
            except json.JSONDecodeError:
                run["plan"] = None
    return runs


def is_plain(run):
    return run.get("program") == PLAIN


def overlap_cells(run):
    ranks = run.get("trace") or []
    if not ranks:
        return "–", "–"
    overlap = "/".join(pct(r.get("overlap")) for r in ranks)
    exposed = "/".join(fmt(number(r.get("exposed_comm_ms")), "%.0f") for r in ranks)
    return overlap, exposed


def device_overlap_cell(run):
    """The overlap timed on the device (device_* spans), or – when the trace has none."""
    ranks = [r for r in (run.get("trace") or []) if r.get("device_timed")]
    if not ranks:
        return "–"
    return "/".join(pct(r.get("device_overlap")) for r in ranks)


def status_cell(run):
    m = run.get("metrics") or {}
    if run["status"] != "ok":
        return "**%s**" % run["status"]
    return "ok†" if m.get("missing_keys") else "ok"


def missing_note(runs):
    """The footnote for ok†: the issue-23 keys some runs' metrics lack."""
    keys = sorted({k for r in runs for k in ((r.get("metrics") or {}).get("missing_keys") or [])})
    return ["", "† the metrics lack " + ", ".join(keys)] if keys else []


def tests_section(folder):
    rows = []
    for name in sorted(os.listdir(folder)):
        match = re.match(r"(test_\w+?)(?:-np(\d+))?(?:-rank(\d+))?\.xml$", name)
        if not match:
            continue
        with open(os.path.join(folder, name)) as f:
            text = f.read()
        head = re.search(r"<testsuites[^>]*>", text)
        attrs = dict(re.findall(r'(\w+)="([^"]*)"', head.group(0))) if head else {}
        skipped = len(re.findall(r'result="skipped"', text))
        rows.append([match.group(1), int(match.group(2) or 1), int(match.group(3) or 0), attrs.get("tests", "?"),
                     attrs.get("failures", "?"), attrs.get("errors", "?"), skipped])
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    if not rows:
        return []
    return ["## CUDA tests", ""] + table(["program", "ranks", "rank", "tests", "failures", "errors", "skipped"], rows) + [""]


def bench_section(runs, rows_out):
    bench = [r for r in runs if r["phase"].startswith("bench")]
    if not bench:
        return []
    out = ["## Throughput: one rank, bf16, AdamW, context 1024", "",
           "Medians over the steps after the first two. TFLOP/s and MFU count the model's FLOPs one way, dtrain's",
           "(train::model_flops_per_unit, PaLM's convention): 6 per parameter that takes part in a matrix product,",
           "per token, plus attention's 12 L T C (no causal halving); position and lookup-only token embeddings",
           "are left out. MFU is that over the peak TFLOP/s dtrain's GEMM probe measured or --peak-tflops gave;",
           "bench_gpt_cuda counts the same against the same cached peak. The peaks are the caching allocator's",
           "(cuda_*_peak_bytes, largest rank). \"%s\" is LibTorch" % PLAIN_LABEL,
           "alone on the same GPT with dtrain's bf16 policy (fp32 master weights and AdamW state, bf16 compute",
           "copies cast every step); \"vs plain LibTorch\" is a run's tokens/s over its; \"/ single\" over dtrain single's.",
           ""]
    header = ["model", "run", "status", "ms/step", "tokens/s", "TFLOP/s", "MFU", "peak TFLOP/s",
              "CUDA allocated peak", "reserved peak", "vs plain LibTorch", "/ single"]
    rows = []
    targets = []
    by_model = {}
    for run in bench:
        by_model.setdefault(run["phase"], []).append(run)
    for phase, group in by_model.items():
        group = sorted(group, key=lambda r: not is_plain(r))  # the baseline first, then the script's order
        model = next((shape(r["args"]) for r in group if not is_plain(r)), shape(group[0]["args"]))
        params = next((r["metrics"]["parameters"] for r in group if r.get("metrics") and r["metrics"].get("parameters")), None)
        label = "%s (%s)" % (model, ("%.0fM" if params >= 1e7 else "%.2fM") % (params / 1e6) if params else "?")

        def tokens_of(predicate):
            return next((r["metrics"]["tokens_per_s"] for r in group if r["status"] == "ok" and r.get("metrics") and
                         predicate(r) and r["metrics"].get("tokens_per_s")), None)
        plain = tokens_of(is_plain)
        single = tokens_of(lambda r: not is_plain(r) and arg_value(r["args"], "--strategy") == "single")
        for run in group:
            m = run.get("metrics") or {}
            ok = run["status"] == "ok"
            strategy = "plain" if is_plain(run) else arg_value(run["args"], "--strategy", "?")
            tflops = model_tflops(m)
            precision = arg_value(run["args"], "--mixed-precision", "none")
            tokens = m.get("tokens_per_s") if ok else None
            vs_plain = tokens / plain if plain and tokens else None
            vs_single = tokens / single if single and tokens else None
            name = PLAIN_LABEL if is_plain(run) else LABELS.get(strategy, strategy)
            rows.append([label, "%s, %s" % (name, precision), status_cell(run),
                         fmt(m.get("step_time_s") and m["step_time_s"] * 1e3, "%.1f"),
                         thousands(m.get("tokens_per_s")),
                         fmt(tflops, "%.1f"), pct(m.get("mfu")), fmt(m.get("peak_tflops"), "%.0f"),
                         gib(m.get("cuda_allocated_peak_bytes")), gib(m.get("cuda_reserved_peak_bytes")),
                         fmt(vs_plain, "%.2f"), fmt(vs_single, "%.2f")])
            rows_out.append({"section": "bench", "name": run["name"], "model": model, "parameters": m.get("parameters") or params,
                             "program": run.get("program", "dtrain"), "strategy": strategy, "mixed_precision": precision,
                             "status": run["status"], "tflops_6n": tflops, "vs_plain": vs_plain, "vs_single": vs_single,
                             **{k: m.get(k) for k in ("step_time_s", "tokens_per_s", "mfu", "peak_tflops",
                                                     "cuda_allocated_peak_bytes", "cuda_reserved_peak_bytes")}})
        fsdp = next((r for r in group if not is_plain(r) and arg_value(r["args"], "--strategy") == "fsdp"), None)
        if fsdp is not None:
            m = fsdp.get("metrics") or {}
            words = []
            # Issue 36: the trainer costs nothing: single and DDP >= 0.98x plain LibTorch, FSDP Full >= 0.95x.
            for strategy, target in (("single", TARGET_TRAINER_RATIO), ("ddp", TARGET_TRAINER_RATIO),
                                     ("fsdp", TARGET_RATIO)):
                run = next((r for r in group if not is_plain(r) and arg_value(r["args"], "--strategy") == strategy), None)
                tokens = (run.get("metrics") or {}).get("tokens_per_s") if run and run["status"] == "ok" else None
                ratio = tokens / plain if plain and tokens else None
                words.append("%s / plain LibTorch = %s (target >= %.2f: %s)" % (
                    LABELS.get(strategy, strategy), fmt(ratio, "%.3f"), target,
                    "–" if ratio is None else "met" if ratio >= target else "**not met**"))
            words[0] = "%s: %s" % (label, words[0])
            if phase == "bench-1.3b":
                mfu = m.get("mfu") if fsdp["status"] == "ok" else None
                words.append("its MFU %s (target >= %.0f%% at 1.3B: %s)" % (
                    pct(mfu), 100 * TARGET_MFU, "–" if mfu is None else "met" if mfu >= TARGET_MFU else "**not met**"))
            targets.append("- " + "; ".join(words))
    targets = ["", "Targets:", ""] + targets if targets else []
    return out + table(header, rows) + missing_note(bench) + targets + [""]


def e2e_section(runs, rows_out, phases=("e2e", "extra")):
    chosen = [r for r in runs if r["phase"] in phases]
    if not chosen:
        return []
    header = ["run", "strategy", "ranks", "backend", "status", "exit", "final", "steps", "resumed from", "device",
              "tokens/s", "MFU", "CUDA allocated peak", "overlap (per rank)", "s"]
    rows = []
    for run in chosen:
        m = run.get("metrics") or {}
        overlap, _ = overlap_cells(run)
        rows.append([run["name"], arg_value(run["args"], "--strategy", "?") + (", " + arg_value(run["args"], "--mixed-precision")
                                                                              if arg_value(run["args"], "--mixed-precision") else ""),
                     run["nproc"], run.get("backend") or "–", status_cell(run), run["rc"],
                     "yes" if m.get("final") else "**no**", fmt(m.get("steps"), "%s"),
                     fmt(m.get("resumed_from_step"), "%s"), m.get("device") or "–",
                     fmt(m.get("tokens_per_s"), "%.0f"), pct(m.get("mfu")), gib(m.get("cuda_allocated_peak_bytes")),
                     overlap, run["seconds"]])
        rows_out.append({"section": "e2e", "name": run["name"], "status": run["status"], "rc": run["rc"],
                         "final": m.get("final"), "device": m.get("device"), "resumed_from_step": m.get("resumed_from_step"),
                         "missing_keys": m.get("missing_keys"), "trace": run.get("trace"),
                         **{k: m.get(k) for k in ("step_time_s", "tokens_per_s", "mfu", "cuda_allocated_peak_bytes",
                                                  "cuda_reserved_peak_bytes")}})
    return ["## `dtrain train --device cuda` end to end", ""] + table(header, rows) + missing_note(chosen) + [""]


def overlap_section(runs, rows_out):
    chosen = [r for r in runs if r["phase"] == "overlap"]
    if not chosen:
        return []
    header = ["run", "strategy", "status", "ms/step", "tokens/s", "overlap (per rank)", "exposed comm ms (per rank)",
              "device overlap (per rank)", "CUDA allocated peak (largest rank)", "extra flags"]
    rows = []
    for run in chosen:
        m = run.get("metrics") or {}
        overlap, exposed = overlap_cells(run)
        extra = " ".join(f"{a} {arg_value(run['args'], a, '')}".strip() for a in run["args"]
                         if a.startswith("--") and "stream" in a) or "–"
        rows.append([run["name"], arg_value(run["args"], "--strategy", "?"), status_cell(run),
                     fmt(m.get("step_time_s") and m["step_time_s"] * 1e3, "%.1f"), fmt(m.get("tokens_per_s"), "%.0f"),
                     overlap, exposed, device_overlap_cell(run), gib(m.get("cuda_allocated_peak_bytes")), extra])
        rows_out.append({"section": "overlap", "name": run["name"], "status": run["status"],
                         "step_time_s": m.get("step_time_s"), "trace": run.get("trace")})
    return ["## Two ranks on the one GPU (Gloo), traced", "",
            "overlap = 1 - exposed / comm from `dtrain trace summary` over the whole run (host spans); device "
            "overlap: the same from the spans timed on the GPU (none with --comm-streams off).", ""] + table(header, rows) + \
        missing_note(chosen) + [""]


def largest_section(runs, rows_out):
    chosen = [r for r in runs if r["phase"] == "largest"]
    if not chosen:
        return []
    header = ["run", "shape", "parameters", "activation checkpointing", "status", "plan: peak", "CUDA allocated peak",
              "reserved peak", "ms/step", "MFU"]
    rows = []
    for run in chosen:
        m = run.get("metrics") or {}
        plan = run.get("plan") or {}
        params = m.get("parameters") or plan.get("parameters")
        rows.append([run["name"], shape(run["args"]), "%.2fB" % (params / 1e9) if params else "–",
                     "yes" if arg_value(run["args"], "--activation-checkpointing", "off") == "on" else "**no**", status_cell(run),
                     gib(plan.get("peak_bytes")), gib(m.get("cuda_allocated_peak_bytes")),
                     gib(m.get("cuda_reserved_peak_bytes")), fmt(m.get("step_time_s") and m["step_time_s"] * 1e3, "%.0f"),
                     pct(m.get("mfu"))])
        rows_out.append({"section": "largest", "name": run["name"], "status": run["status"], "parameters": params,
                         "plan_peak_bytes": plan.get("peak_bytes"),
                         "cuda_allocated_peak_bytes": m.get("cuda_allocated_peak_bytes")})
    return ["## Largest model at one rank: FSDP (+ activation checkpointing) vs `dtrain plan`", ""] + table(header, rows) + \
        missing_note(chosen) + [""]


def skipped_section(runs):
    skipped = [r["name"] for r in runs if r["status"] == "NO-TIME-LEFT"]
    return ["Not run (DEADLINE reached): " + ", ".join(skipped), ""] if skipped else []


def render(folder, title):
    runs = load_runs(folder)
    rows = []
    lines = ["# " + title, ""]
    for name in ("summary.txt", "machine.txt"):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            with open(path) as f:
                lines += ["```", f.read().rstrip(), "```", ""]
    lines += tests_section(folder)
    lines += e2e_section(runs, rows)
    lines += bench_section(runs, rows)
    probe = os.path.join(folder, "bench.txt")
    if os.path.exists(probe):
        with open(probe) as f:
            text = "".join(l for l in f if not l.startswith("[W"))
        lines += ["## `bench_gpt_cuda` output (bench.txt)", "", "```",
                  text.rstrip(), "```", ""]
    lines += overlap_section(runs, rows)
    lines += largest_section(runs, rows)
    lines += skipped_section(runs)
    if not runs:
        lines += ["No `dtrain train` run was recorded (runs.jsonl is missing or empty).", ""]
    return "\n".join(lines), rows


def cmd_table(args):
    folder, tmp = open_runs(args.runs)
    try:
        text, rows = render(folder, args.title)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"title": args.title, "rows": rows}, f, indent=1, sort_keys=True)
            f.write("\n")
    return 0


# --- self-test ------------------------------------------------------------------------------

def cmd_selftest(_args):
    tmp = tempfile.mkdtemp(prefix="gpu_report.selftest.")
    try:
        def write(name, records):
            with open(os.path.join(tmp, name), "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)

        def step(i, tokens, **extra):
            return dict(step=i, loss=5.0 - i / 10, step_time_s=16384 / tokens, tokens_per_s=tokens, **extra)

        gpu = dict(mfu=0.41, peak_tflops=780.0, cuda_allocated_peak_bytes=[30 << 30], cuda_reserved_peak_bytes=[32 << 30])
        final = dict(final=True, steps=6, loss=4.4, world_size=1, parameters=1211224064, device="cuda:0")
        base = ["--model", "gpt", "--gpt-layers", "24", "--gpt-dim", "2048", "--gpt-heads", "16", "--seq-len", "1024",
                "--batch-size", "16", "--mixed-precision", "bf16"]
        write("b-single.jsonl", [step(i, 50000.0 + i, **gpu) for i in range(1, 7)] + [dict(final, strategy="single")])
        write("b-fsdp.jsonl", [step(i, 48000.0, **gpu) for i in range(1, 7)] + [dict(final, strategy="fsdp")])
        # bench_gpt_cuda: its human line, then its JSON line (the script keeps only the latter; either reads).
        plain = dict(bench="bench_gpt_cuda", model="gpt", parameters=1211224064, mixed_precision="bf16", steps=8,
                     step_time_s=16384 / 50000.0, tokens_per_s=50000.0, mfu=0.43, peak_tflops=780.0,
                     cuda_allocated_peak_bytes=28 << 30, cuda_reserved_peak_bytes=31 << 30, loss=4.5, device="cuda:0")
        with open(os.path.join(tmp, "b-plain.jsonl"), "w") as f:
            f.write("bench_gpt_cuda: plain LibTorch GPT 1211.22M ...\n" + json.dumps(plain) + "\n")
        small = ["--model", "gpt", "--gpt-layers", "24", "--gpt-dim", "1024", "--gpt-heads", "16", "--seq-len", "1024",
                 "--batch-size", "32", "--mixed-precision", "bf16"]
        write("s-plain.jsonl", [dict(plain, parameters=303622144, tokens_per_s=100000.0, step_time_s=0.32768)])
        write("s-fsdp.jsonl", [step(i, 90000.0, **gpu) for i in range(1, 7)] +
              [dict(final, strategy="fsdp", parameters=303622144)])
        write("s-zero2.jsonl", [step(1, 95000.0)])
        old = dict(final, strategy="ddp")
        del old["device"]
        write("e-old.jsonl", [step(i, 900.0) for i in range(1, 4)] + [old])
        write("e-broken.jsonl", [step(1, 900.0)])
        write("e-resume.jsonl", [{"resumed_from_step": 3}, step(4, 900.0, **gpu), dict(final, resumed_from_step=3)])
        with open(os.path.join(tmp, "o-fsdp.trace-summary.json"), "w") as f:
            json.dump({"ranks": [{"rank": 0, "overlap": 0.8, "exposed_comm_ms": 12.0, "device_timed": True,
                                  "device_overlap": 0.9},
                                 {"rank": 1, "overlap": 0.75, "exposed_comm_ms": 15.0, "device_timed": True,
                                  "device_overlap": 0.85}]}, f)
        two = dict(gpu, cuda_allocated_peak_bytes=[1 << 30, 3 << 30])
        write("o-fsdp.jsonl", [step(i, 2000.0, **two) for i in range(1, 5)] + [dict(final, strategy="fsdp", world_size=2)])
        with open(os.path.join(tmp, "l-40.plan.json"), "w") as f:
            json.dump({"parameters": 8060000000, "peak_bytes": 130 << 30}, f)
        write("l-40.jsonl", [step(i, 9000.0, **gpu) for i in range(1, 4)] + [dict(final, strategy="fsdp", parameters=8060000000)])
        with open(os.path.join(tmp, "test_cuda_training-np2-rank1.xml"), "w") as f:
            f.write('<testsuites tests="4" failures="0" errors="0"><testcase result="skipped"/></testsuites>')
        manifest = [("b-plain", "bench-1.3b", "ok", ["bench_gpt_cuda"] + base[2:] + ["--steps", "8", "--device", "cuda"]),
                    ("b-single", "bench-1.3b", "ok", base + ["--strategy", "single"]),
                    ("b-fsdp", "bench-1.3b", "ok", base + ["--strategy", "fsdp"]),
                    ("s-fsdp", "bench-350m", "ok", small + ["--strategy", "fsdp"]),
                    ("s-zero2", "bench-350m", "FAIL(1)", small + ["--strategy", "zero2"]),
                    ("s-plain", "bench-350m", "ok", ["bench_gpt_cuda"] + small[2:]),
                    ("e-old", "e2e", "ok", ["--strategy", "ddp"]),
                    ("e-broken", "e2e", "FAIL(1)", ["--strategy", "fsdp"]),
                    ("e-resume", "e2e", "ok", ["--strategy", "single", "--resume"]),
                    ("o-fsdp", "overlap", "ok", ["--strategy", "fsdp", "--trace", "x"]),
                    ("l-40", "largest", "ok", base + ["--strategy", "fsdp", "--activation-checkpointing", "on"]),
                    ("l-36", "largest", "NO-TIME-LEFT", base)]
        for name, phase, status, argv in manifest:
            cmd_record(argparse.Namespace(work=tmp, name=name, phase=phase, nproc=1, status=status, rc=0, seconds=3,
                                          backend="c10d", rest=argv,
                                          program=PLAIN if argv[0] == PLAIN else "dtrain"))
        checks = {"b-single.jsonl": 0, "e-old.jsonl": 2, "e-broken.jsonl": 1}
        for name, expected in checks.items():
            got = cmd_check(argparse.Namespace(metrics=os.path.join(tmp, name), resumed=False))
            assert got == expected, (name, got, expected)
        assert cmd_check(argparse.Namespace(metrics=os.path.join(tmp, "e-resume.jsonl"), resumed=True)) == 0
        assert cmd_check(argparse.Namespace(metrics=os.path.join(tmp, "b-fsdp.jsonl"), resumed=True)) == 1
        text, rows = render(tmp, "self-test")
        plain_rows = {r["name"]: r for r in rows if r["section"] == "bench"}
        assert plain_rows["b-plain"]["program"] == PLAIN and plain_rows["b-plain"]["vs_plain"] == 1.0, plain_rows
        assert abs(plain_rows["b-fsdp"]["vs_plain"] - 0.96) < 1e-9 and plain_rows["s-zero2"]["vs_plain"] is None
        assert [r["name"] for r in rows if r["section"] == "bench"][:3] == ["b-plain", "b-single", "b-fsdp"]
        assert [r["name"] for r in rows if r["section"] == "bench"][3] == "s-plain"  # the baseline first
        for expected in ("| L24 d2048 h16 T1024 B16 (1211M) | plain LibTorch (bench_gpt_cuda), bf16 | ok | 327.7 | 50,000 |",
                         "| 43.0% |", "| 28.00 GiB | 31.00 GiB | 1.00 | – |", "| 1.00 | 1.00 |", "| 0.96 | 0.96 |",
                         "| L24 d1024 h16 T1024 B32 (304M) | dtrain FSDP Full, bf16 | ok |", "| 0.90 | – |",
                         "(1211M): dtrain single (no wrapper) / plain LibTorch = 1.000 (target >= 0.98: met); "
                         "dtrain DDP / plain LibTorch = – (target >= 0.98: –); "
                         "dtrain FSDP Full / plain LibTorch = 0.960 (target >= 0.95: met); its MFU 41.0% (target >= 40% at 1.3B: met)",
                         "dtrain FSDP Full / plain LibTorch = 0.900 (target >= 0.95: **not met**)\n"):
            assert expected in text, (expected, text)
        for expected in ("| 1.00 |", "| 0.96 |", "41.0%", "80.0%/75.0%", "| 3.00 GiB |", "130.00 GiB", "NO-TIME-LEFT", "| ok† |", "final.device",
                         "| test_cuda_training | 2 | 1 | 4 | 0 | 0 | 1 |", "8.06B", "| 1 |"):
            assert expected in text, (expected, text)
        tarball = os.path.join(tmp, "runs.tar.gz")
        with tarfile.open(tarball, "w:gz") as tar:
            tar.add(tmp, arcname="gpu-runs", filter=lambda m: None if m.name.endswith(".tar.gz") else m)
        folder, unpacked = open_runs(tarball)
        again, _ = render(folder, "self-test")
        shutil.rmtree(unpacked)
        assert again == text
        print(text)
        print("gpu_report selftest: OK")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check")
    p.add_argument("metrics")
    p.add_argument("--resumed", action="store_true", help="the run must say resumed_from_step > 0")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("peak")
    p.add_argument("metrics")
    p.set_defaults(func=cmd_peak)
    p = sub.add_parser("record")
    p.add_argument("work")
    p.add_argument("--name", required=True)
    p.add_argument("--phase", required=True)
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--status", required=True)
    p.add_argument("--rc", type=int, default=0)
    p.add_argument("--seconds", type=int, default=0)
    p.add_argument("--backend", default="")
    p.add_argument("--program", default="dtrain", choices=("dtrain", PLAIN),
                   help="what ran: dtrain train (NAME.jsonl its --metrics) or bench_gpt_cuda (its JSON line)")
    p.set_defaults(func=cmd_record)
    p = sub.add_parser("table")
    p.add_argument("runs", help="the run folder or gpu_runs.tar.gz")
    p.add_argument("--md")
    p.add_argument("--json")
    p.add_argument("--title", default="GPU check (scripts/device/gpu_check.sh)")
    p.set_defaults(func=cmd_table)
    p = sub.add_parser("selftest")
    p.set_defaults(func=cmd_selftest)
    argv, rest = sys.argv[1:], []
    if "--" in argv:  # record's run arguments: everything after the first --
        rest = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    args = parser.parse_args(argv)
    args.rest = rest
    try:
        return args.func(args)
    except InputError as e:
        print("gpu_report: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
