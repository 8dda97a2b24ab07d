#!/usr/bin/env python3
"""A model larger than one rank's memory trains under FSDP (issue 15).

    check_bigger_than_rank.py --cap-mb CAP --train-args "ARGS" DTRAIN -- MODEL_ARGS...

MODEL_ARGS go to both `dtrain plan` and `dtrain train`; ARGS (data, steps)
to `dtrain train` only.

With DTRAIN_MEMORY_CAP_MB=CAP on every rank (the tracking allocator refuses
any tensor beyond it), for a model whose fp32 parameters alone are at least
1.4x the cap:
- the uncapped single-process run gives the reference losses;
- every strategy that `dtrain plan` says fits under the cap (its overall
  peak, the start included) trains with the cap, on 4 ranks, to the same
  losses (1e-4, fp32), and its measured start (construction) peak equals the
  plan's within 1%;
- every one the plan says does not fit fails with the cap's message, which
  names the phase it ran out in, and with a non-zero exit; DDP and single
  run out while building the model.
fsdp must be among those that fit, or the test fails: that is its point.

With --save-initial-weights TOOL (tests/train/save_initial_weights.cpp), fsdp
also trains under the cap from --init-from a file of the same initial weights
(each rank reads only its pieces of it), to the same losses.
"""

import argparse
import json
import os
import shlex
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_dtrain import fail, read_metrics, run, say  # noqa: E402

NPROC = 4
STRATEGIES = ["fsdp", "zero2", "hsdp", "ddp", "single"]


def plan(dtrain, strategy, model_args):
    nproc = 1 if strategy == "single" else NPROC
    # single is DDP's replica without the buckets or the broadcast; plan it as
    # ddp on one rank (an upper bound is all the test needs of it).
    args = [dtrain, "plan", "--strategy", "ddp" if strategy == "single" else strategy, "--nproc", str(nproc), "--json"]
    if strategy == "hsdp":
        args += ["--hybrid-group-size", str(NPROC // 2)]  # what dtrain train uses on 4 ranks
    _, output = run(args + model_args)
    return json.loads(output[output.index("{"):])


def losses_of(records):
    return [r["loss"] for r in records if "loss" in r and "final" not in r]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dtrain")
    parser.add_argument("--cap-mb", type=float, required=True)
    parser.add_argument("--train-args", default="")
    parser.add_argument("--save-initial-weights")
    parser.add_argument("model_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    model_args = [a for a in args.model_args if a != "--"]
    train_args = shlex.split(args.train_args)
    cap = int(args.cap_mb * 1024 * 1024)
    workdir = tempfile.mkdtemp(prefix="dtrain-bigger-")

    plans = {s: plan(args.dtrain, s, model_args) for s in STRATEGIES}
    parameter_bytes = plans["fsdp"]["parameters"] * 4
    if parameter_bytes < 1.4 * cap:
        fail("the model's parameters are %d bytes, not at least 1.4x the cap of %d: the test would prove nothing"
             % (parameter_bytes, cap))
    fits = {s: p["peak_bytes"] < cap for s, p in plans.items()}
    say("parameters %.1f MiB, cap %.1f MiB; plan's overall peaks: %s" % (
        parameter_bytes / 2**20, cap / 2**20,
        ", ".join("%s %.1f MiB%s" % (s, p["peak_bytes"] / 2**20, "" if fits[s] else " (over)") for s, p in plans.items())))
    if not fits["fsdp"]:
        fail("dtrain plan says fsdp does not fit under the cap on %d ranks: choose a model that it says fits" % NPROC)

    os.environ.pop("DTRAIN_MEMORY_CAP_MB", None)
    reference_path = os.path.join(workdir, "reference.jsonl")
    run([args.dtrain, "train", "--strategy", "single", "--nproc", "1", "--log-every", "1", "--metrics", reference_path]
        + model_args + train_args)
    reference = losses_of(read_metrics(reference_path))

    os.environ["DTRAIN_MEMORY_CAP_MB"] = str(args.cap_mb)
    for strategy in STRATEGIES:
        nproc = 1 if strategy == "single" else NPROC
        path = os.path.join(workdir, strategy + ".jsonl")
        command = [args.dtrain, "train", "--strategy", strategy, "--nproc", str(nproc), "--log-every", "1",
                   "--metrics", path] + model_args + train_args
        if fits[strategy]:
            run(command)
            records = read_metrics(path)
            losses, final = losses_of(records), records[-1]
            if len(losses) != len(reference):
                fail("%s logged %d steps, the reference %d" % (strategy, len(losses), len(reference)))
            for step, (a, b) in enumerate(zip(reference, losses), 1):
                if abs(a - b) > 1e-4:
                    fail("%s under the cap: step %d loss %.8f, uncapped single process %.8f" % (strategy, step, b, a))
            planned = plans[strategy]["construction_peak_bytes"]
            measured = final["construction_peak_bytes"]
            if abs(measured - planned) > 0.01 * planned:
                fail("%s: start peak %d bytes measured, %d planned (more than 1%% apart)" % (strategy, measured, planned))
            if final["peak_memory_bytes"] > cap or final["peak_memory_bytes"] != max(
                    final["construction_peak_bytes"], final["step_peak_bytes"]):
                fail("%s: peaks inconsistent with the cap %d: %s" % (strategy, cap, final))
            say("%s trains under the cap: losses equal the uncapped single-process run's; start peak %d bytes "
                "(plan %d), step peak %d (plan %d)" % (strategy, measured, planned, final["step_peak_bytes"],
                                                       plans[strategy]["step_peak_bytes"]))
        else:
            code, output = run(command, expect_code=None)
            if code == 0:
                fail("%s trained under the cap, but dtrain plan says its peak is %d bytes, over the cap %d"
                     % (strategy, plans[strategy]["peak_bytes"], cap))
            if "is out of memory during the " not in output or "DTRAIN_MEMORY_CAP_MB" not in output:
                fail("%s failed (exit %d) without the cap's message naming the phase" % (strategy, code))
            if strategy in ("ddp", "single") and "during the construction of the model" not in output:
                fail("%s should run out while building the whole model" % strategy)
            say("%s does not fit (plan %d bytes) and stops with the cap's message" % (strategy,
                                                                                    plans[strategy]["peak_bytes"]))
    if args.save_initial_weights:
        weights = os.path.join(workdir, "initial.safetensors")
        value = lambda flag: model_args[model_args.index(flag) + 1]
        os.environ.pop("DTRAIN_MEMORY_CAP_MB", None)
        run([args.save_initial_weights, weights, "0", "seeded", "gpt", value("--gpt-layers"), value("--gpt-dim"),
             value("--gpt-heads"), value("--seq-len")])
        os.environ["DTRAIN_MEMORY_CAP_MB"] = str(args.cap_mb)
        path = os.path.join(workdir, "fsdp-init-from.jsonl")
        run([args.dtrain, "train", "--strategy", "fsdp", "--nproc", str(NPROC), "--log-every", "1", "--metrics", path,
             "--init-from", weights] + model_args + train_args)
        records = read_metrics(path)
        for step, (a, b) in enumerate(zip(reference, losses_of(records)), 1):
            if abs(a - b) > 1e-4:
                fail("fsdp --init-from under the cap: step %d loss %.8f, uncapped single process %.8f" % (step, b, a))
        planned = plan(args.dtrain, "fsdp", model_args + ["--init-from", weights])["construction_peak_bytes"]
        measured = records[-1]["construction_peak_bytes"]
        if abs(measured - planned) > 0.01 * planned:
            fail("fsdp --init-from: start peak %d bytes measured, %d planned" % (measured, planned))
        say("fsdp trains under the cap from --init-from (%.1f MiB file, each rank reading its pieces): same losses, "
            "start peak %d bytes (plan %d)" % (os.path.getsize(weights) / 2**20, measured, planned))
    say("PASS")


if __name__ == "__main__":
    main()
