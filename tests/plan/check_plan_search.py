#!/usr/bin/env python3
"""Checks `dtrain plan --search` against dtrain plan and dtrain train (issue 40),
on 4 ranks with a tiny GPT (the argument: the dtrain binary):

1. the search at --top 0 lists a pipeline layout and a tensor-parallel one,
   sorted by predicted tokens/s, each within --device-memory, and --top 5 is
   the first 5 rows of --top 0;
2. for a sample of rows (the first 8, and the fastest with --pp, --tp, --cp,
   hsdp and activation checkpointing) `dtrain plan` of the same layout
   predicts the same peak bytes (exactly) and step time (relative 1e-9);
3. `dtrain train` runs the first row, the fastest --pp row and the fastest
   --tp row for 2 steps, each within 1.05x its planned peak;
4. `dtrain train --parallel auto --plan-link LINK` and the same run with the
   layout it chose given by hand train bitwise the same losses.

Prints one line starting with "ok search" when everything holds; exits
non-zero with the failed check and its command otherwise."""
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

NPROC = 4
MODEL = ["--model", "gpt", "--gpt-layers", "4", "--gpt-dim", "64", "--gpt-heads", "4", "--seq-len", "32",
         "--batch-size", "8"]
TOKENS_PER_STEP = 8 * 32
LINK = "20,1"
RATES = ["--gemm-gflops", "50", "--memory-gbps", "10"]
DEVICE_MEMORY = "64MiB"
RUN = ["--nproc", str(NPROC), "--steps", "2", "--samples", "0", "--seed", "0"]
PEAK_SLACK = 1.05     # measured peak / planned peak, at most
TIME_RTOL = 1e-9      # the search's step time against dtrain plan's
SAMPLE_FIRST = 8      # rows checked against dtrain plan from the top of the list


def fail(message):
    sys.exit("check_plan_search: FAILED: " + message)


def run(cmd, what):
    """Runs cmd; fails with its command line and the end of its output when it exits non-zero."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        fail("%s: exit %d\n  command: %s\n  output (end):\n%s" % (what, proc.returncode, shlex.join(cmd), tail))
    return proc.stdout


def value(flags, name):
    """The value after --name in a flag list, or None."""
    return flags[flags.index(name) + 1] if name in flags else None


def degree(flags, name):
    return int(value(flags, name) or 1)


def text(flags):
    return " ".join(flags)


# ---- 1. the search ----------------------------------------------------------

def search(dtrain, top):
    cmd = [dtrain, "plan", "--search"] + MODEL + ["--nproc", str(NPROC), "--link", LINK] + RATES + [
        "--device-memory", DEVICE_MEMORY, "--top", str(top), "--json"]
    out = run(cmd, "dtrain plan --search --top %d" % top)
    try:
        return json.loads(out), cmd
    except json.JSONDecodeError as error:
        fail("dtrain plan --search --top %d printed no JSON document (%s)\n  command: %s" % (top, error,
                                                                                              shlex.join(cmd)))


def check_search(dtrain):
    result, cmd = search(dtrain, 0)
    where = "\n  command: " + shlex.join(cmd)
    rows = result["layouts"]
    if result["nproc"] != NPROC:
        fail("the search says nproc %r, not %d%s" % (result["nproc"], NPROC, where))
    if not rows:
        fail("the search lists no layout%s" % where)
    if not any(degree(r["train_flags"], "--pp") > 1 for r in rows):
        fail("no listed layout has --pp > 1 (%d layouts)%s" % (len(rows), where))
    if not any(degree(r["train_flags"], "--tp") > 1 for r in rows):
        fail("no listed layout has --tp > 1 (%d layouts)%s" % (len(rows), where))
    limit = result["memory_limit_bytes"]
    for i, r in enumerate(rows):
        if r["peak_bytes"] > limit:
            fail("row %d (%s) peaks at %d bytes, over the memory limit of %d%s" % (i + 1, text(r["train_flags"]),
                                                                                  r["peak_bytes"], limit, where))
        if not math.isclose(r["tokens_per_second"] * r["step_seconds"], TOKENS_PER_STEP, rel_tol=TIME_RTOL):
            fail("row %d (%s): %r tokens/s x %r s is not the batch's %d tokens%s"
                 % (i + 1, text(r["train_flags"]), r["tokens_per_second"], r["step_seconds"], TOKENS_PER_STEP, where))
        if i > 0 and r["tokens_per_second"] > rows[i - 1]["tokens_per_second"]:
            fail("rows %d and %d are not sorted by tokens/s, descending: %r (%s) before %r (%s)%s"
                 % (i, i + 1, rows[i - 1]["tokens_per_second"], text(rows[i - 1]["train_flags"]),
                    r["tokens_per_second"], text(r["train_flags"]), where))
    top5, cmd5 = search(dtrain, 5)
    if top5["layouts"] != rows[:5]:
        fail("--top 5 does not list the first 5 rows of --top 0\n  --top 5: %s\n  --top 0: %s\n  command: %s"
             % ([text(r["train_flags"]) for r in top5["layouts"]], [text(r["train_flags"]) for r in rows[:5]],
                shlex.join(cmd5)))
    return result


# ---- 2. each sampled row against dtrain plan --------------------------------

def first_index(rows, predicate):
    return next((i for i, r in enumerate(rows) if predicate(r["train_flags"])), None)


def sample(rows):
    """Indices of the rows to check, with why each was picked."""
    picked = {i: "row %d" % (i + 1) for i in range(min(SAMPLE_FIRST, len(rows)))}
    for why, predicate in (("fastest --pp", lambda f: degree(f, "--pp") > 1),
                           ("fastest --tp", lambda f: degree(f, "--tp") > 1),
                           ("fastest --cp", lambda f: degree(f, "--cp") > 1),
                           ("fastest hsdp", lambda f: value(f, "--strategy") == "hsdp"),
                           ("fastest --activation-checkpointing on",
                            lambda f: value(f, "--activation-checkpointing") == "on")):
        i = first_index(rows, predicate)
        if i is not None:
            picked[i] = picked[i] + ", " + why if i in picked else "%s (row %d)" % (why, i + 1)
    return picked


def plan_flags(train_flags):
    """dtrain train's flags for a layout -> dtrain plan's."""
    out = []
    i = 0
    while i < len(train_flags):
        flag = train_flags[i]
        if flag == "--fsdp-prefetch":
            setting = train_flags[i + 1]
            if setting == "off":
                out += ["--forward-prefetch", "false", "--backward-prefetch", "none"]
            elif setting != "on":
                fail("a listed layout has --fsdp-prefetch %r (expected on or off): %s" % (setting, text(train_flags)))
            i += 2
            continue
        out.append(flag)
        i += 1
    if value(train_flags, "--strategy") == "hsdp":
        engine_ranks = NPROC // (degree(train_flags, "--tp") * degree(train_flags, "--pp"))  # dp x cp
        out += ["--hybrid-group-size", str(engine_ranks // 2)]
    return out


def check_against_plan(dtrain, model_flags, row, why):
    flags = row["train_flags"]
    cmd = [dtrain, "plan"] + model_flags + plan_flags(flags) + ["--nproc", str(NPROC), "--rank", "0", "--link",
                                                                LINK] + RATES + ["--json"]
    plan = json.loads(run(cmd, "dtrain plan of %s: %s" % (why, text(flags))))
    if degree(flags, "--pp") > 1:
        peak = max(stage["peak_bytes"] for stage in plan["pipeline"]["per_stage"])
        peak_from = "the largest of pipeline.per_stage[*].peak_bytes"
    else:
        peak = plan["peak_bytes"]
        peak_from = "peak_bytes"
    seconds = (plan.get("time") or {}).get("seconds")
    problems = []
    if row["peak_bytes"] != peak:
        problems.append("peak: the search %d bytes, dtrain plan %d (%s)" % (row["peak_bytes"], peak, peak_from))
    if seconds is None or not math.isclose(row["step_seconds"], seconds, rel_tol=TIME_RTOL, abs_tol=0):
        problems.append("step time: the search %r s, dtrain plan %r s" % (row["step_seconds"], seconds))
    if problems:
        return "%s (%s): %s\n    command: %s" % (why, text(flags), "; ".join(problems), shlex.join(cmd))
    return None


def check_plans(dtrain, result):
    rows = result["layouts"]
    picked = sample(rows)
    workers = max(1, min(4, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        mismatches = [m for m in pool.map(lambda i: check_against_plan(dtrain, result["model_flags"], rows[i],
                                                                        picked[i]), sorted(picked)) if m]
    if mismatches:
        fail("the search and dtrain plan disagree on %d of %d sampled layouts:\n  %s"
             % (len(mismatches), len(picked), "\n  ".join(mismatches)))
    return picked


# ---- 3. dtrain train runs listed layouts within their planned peak --------

def train(dtrain, flags, metrics, what):
    cmd = [dtrain, "train"] + flags + ["--metrics", metrics]
    run(cmd, what)
    try:
        with open(metrics) as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as error:
        fail("%s: no readable metrics in %s (%s)\n  command: %s" % (what, metrics, error, shlex.join(cmd)))
    if not lines or lines[-1].get("final") is not True:
        fail("%s: the metrics' last line is not the final one\n  command: %s" % (what, shlex.join(cmd)))
    final = lines[-1]
    if final.get("steps") != 2 or not isinstance(final.get("loss"), float) or not math.isfinite(final["loss"]):
        fail("%s: expected 2 steps and a finite loss, got steps %r, loss %r\n  command: %s"
             % (what, final.get("steps"), final.get("loss"), shlex.join(cmd)))
    return lines, cmd


def check_runs(dtrain, result, tmp):
    rows = result["layouts"]
    runs = {}
    for why, i in (("the first layout", 0),
                   ("the fastest --pp layout", first_index(rows, lambda f: degree(f, "--pp") > 1)),
                   ("the fastest --tp layout", first_index(rows, lambda f: degree(f, "--tp") > 1))):
        runs[i] = runs[i] + ", " + why if i in runs else why
    over = []
    for n, (i, why) in enumerate(runs.items()):
        row = rows[i]
        what = "dtrain train of %s (row %d: %s)" % (why, i + 1, text(row["train_flags"]))
        lines, cmd = train(dtrain, result["model_flags"] + row["train_flags"] + RUN,
                           os.path.join(tmp, "layout-%d.jsonl" % n), what)
        final = lines[-1]
        if final.get("parallel") != "manual":
            fail("%s: \"parallel\" is %r, not \"manual\"\n  command: %s" % (what, final.get("parallel"),
                                                                          shlex.join(cmd)))
        measured, planned = final["peak_memory_bytes"], row["peak_bytes"]
        print("  run row %d: measured peak %d bytes, planned %d (%.3fx): %s"
              % (i + 1, measured, planned, measured / planned, text(row["train_flags"])))
        if measured > PEAK_SLACK * planned:
            over.append("%s: measured peak %d bytes is %.3fx the planned %d (at most %.2fx)\n    command: %s"
                        % (what, measured, measured / planned, planned, PEAK_SLACK, shlex.join(cmd)))
    if over:
        fail("measured peak over the plan:\n  " + "\n  ".join(over))
    return len(runs)


# ---- 4. --parallel auto is the same run as its layout by hand --------------

def step_losses(lines):
    return [(line["step"], line["loss"]) for line in lines if "loss" in line and "final" not in line
            and "step" in line]


def check_auto(dtrain, tmp):
    logged = ["--log-every", "1"]  # a metrics line per step
    auto_lines, auto_cmd = train(dtrain, ["--parallel", "auto", "--plan-link", LINK] + MODEL + RUN + logged,
                                 os.path.join(tmp, "auto.jsonl"), "dtrain train --parallel auto")
    parallel = auto_lines[-1].get("parallel")
    if not isinstance(parallel, dict) or not isinstance(parallel.get("auto"), str) or not parallel["auto"].strip():
        fail("dtrain train --parallel auto: the final line's \"parallel\" is %r, expected {\"auto\": FLAGS, ...}"
             "\n  command: %s" % (parallel, shlex.join(auto_cmd)))
    chosen = parallel["auto"]
    hand_lines, hand_cmd = train(dtrain, MODEL + chosen.split() + RUN + logged, os.path.join(tmp, "by-hand.jsonl"),
                                 "dtrain train with --parallel auto's layout by hand (%s)" % chosen)
    where = "\n  auto:    %s\n  by hand: %s" % (shlex.join(auto_cmd), shlex.join(hand_cmd))
    if hand_lines[-1].get("parallel") != "manual":
        fail("the run by hand says \"parallel\" %r, not \"manual\"%s" % (hand_lines[-1].get("parallel"), where))
    auto_steps, hand_steps = step_losses(auto_lines), step_losses(hand_lines)
    if [s for s, _ in auto_steps] != [1, 2]:
        fail("--parallel auto logged the losses of steps %r, expected [1, 2]%s" % ([s for s, _ in auto_steps], where))
    if auto_steps != hand_steps:
        fail("per-step losses differ: --parallel auto %r, by hand %r%s" % (auto_steps, hand_steps, where))
    if auto_lines[-1]["loss"] != hand_lines[-1]["loss"]:
        fail("final losses differ: --parallel auto %r, by hand %r%s" % (auto_lines[-1]["loss"],
                                                                        hand_lines[-1]["loss"], where))
    return chosen


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_plan_search.py DTRAIN")
    dtrain = sys.argv[1]
    start = time.monotonic()
    phase = start

    def timed(name):
        nonlocal phase
        now = time.monotonic()
        print("  phase %s: %.1f s" % (name, now - phase))
        phase = now

    result = check_search(dtrain)
    timed("1 (search, --top 0 and 5)")
    picked = check_plans(dtrain, result)
    timed("2 (%d layouts against dtrain plan)" % len(picked))
    with tempfile.TemporaryDirectory(prefix="check_plan_search.") as tmp:
        runs = check_runs(dtrain, result, tmp)
        timed("3 (%d dtrain train runs)" % runs)
        chosen = check_auto(dtrain, tmp)
        timed("4 (--parallel auto and by hand)")
    print("ok search: %d layouts, %d checked against dtrain plan, %d runs, --parallel auto = %s (%.1f s)"
          % (len(result["layouts"]), len(picked), runs, chosen, time.monotonic() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
