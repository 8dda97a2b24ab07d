#!/usr/bin/env python3
"""Compares the per-step training losses of two `dtrain train --metrics` files.

    python3 tests/multihost/compare_losses.py REFERENCE.jsonl RUN.jsonl [--resumed-after K] [--through L]
        [--tolerance T]

RUN must have a loss for every step REFERENCE has (after step K with
--resumed-after K, and then none for the steps up to K: a resumed run starts
right after its checkpoint, which a run restarted from scratch would not);
--through L leaves out both files' steps after L. A step logged twice (a
run restarted from a checkpoint redoes steps) counts with its last loss.
Prints whether the losses are bitwise equal, else the largest absolute
difference; exits 1 if the steps differ or a difference exceeds T (1e-6).
"""

import argparse
import json
import sys


def step_losses(path):
    losses = {}
    with open(path) as lines:
        for line in lines:
            record = json.loads(line)
            if "step" in record and "loss" in record and not record.get("final"):
                losses[record["step"]] = record["loss"]
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference")
    parser.add_argument("run")
    parser.add_argument("--resumed-after", type=int, default=0, metavar="K",
                        help="RUN resumed from the checkpoint of step K")
    parser.add_argument("--through", type=int, default=None, metavar="L", help="compare the steps up to L only")
    parser.add_argument("--tolerance", type=float, default=1e-6)
    args = parser.parse_args()
    last = args.through if args.through is not None else float("inf")
    run = {step: loss for step, loss in step_losses(args.run).items() if step <= last}
    reference = {step: loss for step, loss in step_losses(args.reference).items()
                 if args.resumed_after < step <= last}
    if not reference:
        print(f"{args.reference}: no step losses after step {args.resumed_after}")
        return 1
    if sorted(run) != sorted(reference):
        missing = sorted(set(reference) - set(run))[:5]
        extra = sorted(set(run) - set(reference))[:5]
        print(f"{args.run} has not the steps of {args.reference}"
              + (f" after step {args.resumed_after}" if args.resumed_after else "")
              + (f"; missing {missing}" if missing else "") + (f"; unexpected {extra}" if extra else ""))
        return 1
    worst_step = max(run, key=lambda step: abs(run[step] - reference[step]))
    worst = abs(run[worst_step] - reference[worst_step])
    steps = f"steps {min(run)}..{max(run)} ({len(run)} steps)"
    if worst == 0:
        print(f"{steps}: losses bitwise equal")
        return 0
    verdict = "within" if worst <= args.tolerance else "EXCEEDS"
    print(f"{steps}: largest |loss difference| {worst:.3g} at step {worst_step}, {verdict} tolerance {args.tolerance:g}")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
