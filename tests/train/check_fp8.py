#!/usr/bin/env python3
"""--fp8 in a training run (issue 41; dtrain/float8.h, docs/fp8.md).

    check_fp8.py DTRAIN -- TRAIN_ARGS...

With TRAIN_ARGS (a small GPT, fp32 compute on this CPU):
  1. --fp8 tensorwise over 200 steps ends within 3% of the same run without
     fp8 (the mean loss of the last 20 steps), and --fp8 rowwise too; every
     block's layer went through fp8 (the final line's fp8_calls, no plain calls);
  2. at the default --fp8-min-width (1024) no layer of this narrow model is
     taken: no fp8 call, and the losses equal the run without fp8 bitwise;
  3. a model whose layers do not call dtrain::linear, --tp, and a negative
     --fp8-min-width are refused, naming the cause;
  4. `dtrain plan --fp8 tensorwise` on 2 fsdp ranks plans the weights'
     all-gathers at under half the fp32 gather's bytes, and --fp8-all-gather
     off at the same bytes as without fp8 (the engine's own counts are
     checked against the plan in tests/fsdp/test_fsdp_float8.cpp).
"""
import json

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_dtrain import fail, read_metrics, run, say  # noqa: E402

STEPS = 200
LAST = 20


def train(dtrain, args, folder, name, extra):
    path = os.path.join(folder, name + ".jsonl")
    run([dtrain, "train"] + args + extra + ["--metrics", path, "--log-every", "1"])
    records = read_metrics(path)
    steps = [r["loss"] for r in records if "step" in r and "loss" in r and not r.get("final")]
    return steps, records[-1]


def main():
    dtrain = sys.argv[1]
    args = sys.argv[3:] if sys.argv[2:3] == ["--"] else sys.argv[2:]
    with tempfile.TemporaryDirectory(prefix="dtrain-fp8-") as folder:
        long_run = args + ["--steps", str(STEPS), "--samples", "0", "--eval-every", "0"]
        reference, _ = train(dtrain, long_run, folder, "off", [])
        if len(reference) != STEPS:
            fail("the run without fp8 logged %d steps, expected %d" % (len(reference), STEPS))
        base = sum(reference[-LAST:]) / LAST
        for scaling in ("tensorwise", "rowwise"):
            losses, final = train(dtrain, long_run, folder, scaling, ["--fp8", scaling, "--fp8-min-width", "0"])
            fp8 = final.get("fp8") or {}
            if fp8.get("scaling") != scaling or fp8.get("fp8_calls", 0) == 0 or fp8.get("plain_calls") != 0:
                fail("--fp8 %s: the final line's fp8 record is %r: expected every linear call in fp8" % (scaling, fp8))
            mean = sum(losses[-LAST:]) / LAST
            gap = (mean - base) / base
            say("--fp8 %s: mean loss of the last %d steps %.4f against %.4f without fp8 (%+.2f%%), first %.4f" %
                (scaling, LAST, mean, base, 100 * gap, losses[0]))
            if abs(gap) > 0.03:
                fail("--fp8 %s ends %.2f%% from the run without fp8 (at most 3%%)" % (scaling, 100 * gap))
            if losses == reference:
                fail("--fp8 %s trained exactly as without fp8: were the layers in fp8?" % scaling)

        short = args + ["--steps", "5", "--samples", "0"]
        plain, _ = train(dtrain, short, folder, "short-off", [])
        default, final = train(dtrain, short, folder, "short-default", ["--fp8", "tensorwise"])
        fp8 = final.get("fp8") or {}
        if fp8.get("fp8_calls") != 0 or fp8.get("plain_calls", 0) == 0 or fp8.get("min_width") != 1024:
            fail("at the default --fp8-min-width, this narrow model's layers should all stay as they are: %r" % fp8)
        if default != plain:
            fail("no layer in fp8, yet the losses differ from the run without fp8: %r vs %r" % (default, plain))

        refusals = [
            (["--model", "mlp", "--steps", "1", "--fp8", "tensorwise"], "ModelSpec::float8_layers"),
            (short + ["--fp8", "rowwise", "--nproc", "2", "--tp", "2"], "--fp8 with --tp 2"),
            (short + ["--fp8", "rowwise", "--fp8-min-width", "-1"], "--fp8-min-width must be >= 0"),
        ]
        for extra, message in refusals:
            _, output = run([dtrain, "train"] + extra, expect_code=None)
            if message not in output:
                fail("expected a refusal naming %r" % message)

        model = [a for a in args if a not in ("--strategy", "single")]
        gathered = {}
        for name, extra in (("off", []), ("fp8", ["--fp8", "tensorwise", "--fp8-min-width", "0"]),
                            ("fp8, gather off", ["--fp8", "tensorwise", "--fp8-min-width", "0",
                                                 "--fp8-all-gather", "off"])):
            _, output = run([dtrain, "plan"] + model + ["--nproc", "2", "--strategy", "fsdp", "--json"] + extra)
            plan = json.loads(output[output.index("{"):])
            gathered[name] = sum(c["payload_bytes"] for c in plan["collectives"] if c["op"] == "all_gather")
        say("planned all-gather bytes per step: %r" % gathered)
        if not gathered["fp8"] < gathered["off"] / 2 or gathered["fp8, gather off"] != gathered["off"]:
            fail("dtrain plan --fp8 should halve the gathers' bytes (and leave them with --fp8-all-gather off)")
    say("passed")


if __name__ == "__main__":
    main()
