#!/usr/bin/env python3
"""End-to-end checks of `dtrain train`, through its metrics file.

    check_train.py run [--expect-world-size N] DTRAIN -- TRAIN_ARGS...
        Runs `DTRAIN train TRAIN_ARGS --metrics FILE` and checks that it exits 0
        and that FILE is JSON Lines whose last line is the final record with
        every field the issue lists (and consistent values).

    check_train.py same-losses --variant "ARGS" --variant "ARGS"... [--tolerance 1e-4] \\
            DTRAIN -- TRAIN_ARGS...
        Runs each variant (its ARGS added to TRAIN_ARGS, with --log-every 1) and
        checks that every step's loss, and the final evaluation, match the first
        variant's within the tolerance: same seed, same global batch, any number
        of ranks, the same loss curve.

    check_train.py close-losses --variant "ARGS" --variant "ARGS"... [--relative 0.03] [--last 20] \\
            DTRAIN -- TRAIN_ARGS...
        Runs each variant as same-losses does and checks that where each one
        ends (the final evaluation loss, and the mean training loss of the
        last --last steps) is within --relative of the first variant's: for
        lossy changes (compressed collectives) that must train as well, not
        alike step by step.

    All take --final-check "EXPR" (repeatable): a Python expression over the
    final record's fields (of the last variant, for same-losses) that must be
    true, e.g. --final-check "max_staleness <= 3".
"""

import argparse
import json
import math
import os
import shlex
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_dtrain import fail, read_metrics, run  # noqa: E402,F401  (check_init_from imports them from here)

FINAL_FIELDS = ["final", "steps", "loss", "eval_loss", "eval_accuracy", "world_size", "strategy",
                "step_time_s_median", "peak_memory_bytes", "peak_memory_bytes_per_rank", "peak_rss_bytes",
                "construction_peak_bytes", "step_peak_bytes"]


def train(dtrain, args, metrics_path):
    return run([dtrain, "train"] + args + ["--metrics", metrics_path])[1]


def check_final(records, args):
    final = records[-1]
    missing = [field for field in FINAL_FIELDS if field not in final]
    if final.get("final") is not True or missing:
        fail("the last metrics line is not a complete final record (missing %s): %s" % (missing, final))
    step_lines = [r for r in records[:-1] if "loss" in r]
    if not step_lines or step_lines[-1]["step"] != final["steps"]:
        fail("no step line for the last step %s" % final["steps"])
    for record in step_lines:
        for field in ("step", "loss", "lr", "step_time_s"):
            if field not in record:
                fail("step line without %s: %s" % (field, record))
        if "samples_per_s" not in record and "tokens_per_s" not in record:
            fail("step line without samples_per_s or tokens_per_s: %s" % record)
    if not any("eval_loss" in r for r in records[:-1]):
        fail("no evaluation line")
    if not math.isfinite(final["loss"]) or not math.isfinite(final["eval_loss"]):
        fail("non-finite loss in the final record: %s" % final)
    per_rank = final["peak_memory_bytes_per_rank"]
    if len(per_rank) != final["world_size"] or max(per_rank) != final["peak_memory_bytes"] or min(per_rank) <= 0:
        fail("peak memory per rank %s does not fit world size %d and peak %d"
             % (per_rank, final["world_size"], final["peak_memory_bytes"]))
    if final["peak_memory_bytes"] != max(final["construction_peak_bytes"], final["step_peak_bytes"]):
        fail("peak_memory_bytes %d is not the larger of the start's %d and the steps' %d"
             % (final["peak_memory_bytes"], final["construction_peak_bytes"], final["step_peak_bytes"]))
    if final["peak_rss_bytes"] < final["peak_memory_bytes"]:
        fail("peak RSS %d is below the tracked peak %d" % (final["peak_rss_bytes"], final["peak_memory_bytes"]))
    if args.expect_world_size is not None and final["world_size"] != args.expect_world_size:
        fail("world size %d, expected %d" % (final["world_size"], args.expect_world_size))
    return final


def check_expressions(final, expressions):
    for expression in expressions or []:
        try:
            value = eval(expression, {"__builtins__": {"len": len, "min": min, "max": max, "sum": sum}}, dict(final))
        except Exception as error:  # a missing field or a typo: name it
            fail("--final-check %r cannot be evaluated on %s: %s" % (expression, final, error))
        if not value:
            fail("--final-check %r is false for the final record %s" % (expression, json.dumps(final)))
        print("check_train: %s holds" % expression)


def command_run(args, workdir):
    path = os.path.join(workdir, "metrics.jsonl")
    train(args.dtrain, args.train_args, path)
    final = check_final(read_metrics(path), args)
    check_expressions(final, args.final_check)
    print("check_train: PASS: final record %s" % json.dumps(final))


def command_same_losses(args, workdir):
    runs = []
    for index, variant in enumerate(args.variant):
        path = os.path.join(workdir, "metrics-%d.jsonl" % index)
        train(args.dtrain, args.train_args + shlex.split(variant) + ["--log-every", "1"], path)
        records = read_metrics(path)
        losses = [r["loss"] for r in records if "loss" in r and "final" not in r]
        runs.append((variant, losses, records[-1]))
    reference_variant, reference, reference_final = runs[0]
    worst = 0.0
    for variant, losses, final in runs[1:]:
        if len(losses) != len(reference):
            fail("%r logged %d steps, %r logged %d" % (variant, len(losses), reference_variant, len(reference)))
        for step, (a, b) in enumerate(zip(reference, losses), 1):
            worst = max(worst, abs(a - b))
            if abs(a - b) > args.tolerance:
                fail("step %d: loss %.8f with %r but %.8f with %r (tolerance %g)"
                     % (step, a, reference_variant, b, variant, args.tolerance))
        for field in ("eval_loss", "eval_accuracy"):
            a, b = reference_final.get(field), final.get(field)
            if (a is None) != (b is None) or (a is not None and abs(a - b) > args.tolerance):
                fail("final %s: %s with %r but %s with %r" % (field, a, reference_variant, b, variant))
    check_expressions(runs[-1][2], args.final_check)
    print("check_train: PASS: %d variants, %d steps each, largest loss difference %.3g"
          % (len(runs), len(reference), worst))


def command_close_losses(args, workdir):
    runs = []
    for index, variant in enumerate(args.variant):
        path = os.path.join(workdir, "metrics-%d.jsonl" % index)
        train(args.dtrain, args.train_args + shlex.split(variant) + ["--log-every", "1"], path)
        records = read_metrics(path)
        losses = [r["loss"] for r in records if "loss" in r and "final" not in r]
        final = records[-1]
        if len(losses) < args.last or final.get("eval_loss") is None:
            fail("%r logged %d steps and eval_loss %s" % (variant, len(losses), final.get("eval_loss")))
        ending = {"eval_loss": final["eval_loss"], "last_losses": sum(losses[-args.last:]) / args.last}
        print("check_train: %r: eval_loss %.4f, mean loss of the last %d steps %.4f"
              % (variant, ending["eval_loss"], args.last, ending["last_losses"]))
        runs.append((variant, ending, final))
    reference_variant, reference, _ = runs[0]
    for variant, ending, _ in runs[1:]:
        for field, value in ending.items():
            relative = abs(value - reference[field]) / abs(reference[field])
            if not math.isfinite(value) or relative > args.relative:
                fail("%s %.4f with %r is %.1f%% from %.4f with %r (allowed %.1f%%)"
                     % (field, value, variant, 100 * relative, reference[field], reference_variant,
                        100 * args.relative))
    check_expressions(runs[-1][2], args.final_check)
    print("check_train: PASS: %d variants end within %.1f%% of %r" % (len(runs), 100 * args.relative, reference_variant))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("dtrain")
    run.add_argument("--expect-world-size", type=int)
    run.add_argument("--final-check", action="append")
    run.add_argument("train_args", nargs=argparse.REMAINDER)
    same = sub.add_parser("same-losses")
    same.add_argument("dtrain")
    same.add_argument("--variant", action="append", required=True)
    same.add_argument("--tolerance", type=float, default=1e-4)
    same.add_argument("--final-check", action="append")
    same.add_argument("train_args", nargs=argparse.REMAINDER)
    close = sub.add_parser("close-losses")
    close.add_argument("dtrain")
    close.add_argument("--variant", action="append", required=True)
    close.add_argument("--relative", type=float, default=0.03)
    close.add_argument("--last", type=int, default=20)
    close.add_argument("--final-check", action="append")
    close.add_argument("train_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.train_args[:1] == ["--"]:
        args.train_args = args.train_args[1:]
    if args.command in ("same-losses", "close-losses") and len(args.variant) < 2:
        parser.error(args.command + " needs at least two --variant")
    with tempfile.TemporaryDirectory(prefix="dtrain-train-test-") as workdir:
        if args.command == "run":
            command_run(args, workdir)
        elif args.command == "close-losses":
            command_close_losses(args, workdir)
        else:
            command_same_losses(args, workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
