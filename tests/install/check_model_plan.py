#!/usr/bin/env python3
"""`dtrain plan` of a model against what training it measures (issue 38, item 4).

    check_model_plan.py [--within 0.05] [--expect-source TEXT] DTRAIN -- ARGS...

Runs `DTRAIN plan ARGS --json` and `DTRAIN train ARGS --steps 3 --metrics FILE`
and fails unless the plan's step peak (a training step, per rank) is within
--within of the step peak the run measured (its final line), and the plan's
activations_from contains --expect-source (e.g. "measured": a model without
a description of its own, planned by a probe step).
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from run_dtrain import fail, read_metrics, run, say  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--within", type=float, default=0.05)
    parser.add_argument("--expect-source", default="")
    parser.add_argument("dtrain")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    _, output = run([options.dtrain, "plan"] + args + ["--json"])
    plan = json.loads(output[output.index("{"):])
    if options.expect_source not in plan.get("activations_from", ""):
        fail("the plan's activations_from %r does not say %r" % (plan.get("activations_from"), options.expect_source))
    with tempfile.TemporaryDirectory(prefix="dtrain-plan-check-") as folder:
        metrics = os.path.join(folder, "metrics.jsonl")
        run([options.dtrain, "train"] + args + ["--steps", "3", "--metrics", metrics])
        final = read_metrics(metrics)[-1]
    planned, measured = plan["step_peak_bytes"], final["step_peak_bytes"]
    error = (planned - measured) / measured
    say("step peak per rank: planned %d bytes, measured %d (%+.1f%%); activations %s"
        % (planned, measured, 100 * error, plan.get("activations_from")))
    if abs(error) > options.within:
        fail("the plan is %.1f%% off the measured step peak (allowed %.0f%%)" % (100 * error, 100 * options.within))


if __name__ == "__main__":
    main()
