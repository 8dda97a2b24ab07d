#!/usr/bin/env python3
"""What crosses a pipeline's stage boundaries (issue 39, item 5; Note [stage
dtype] in include/dtrain/pipeline.h).

    check_stage_dtype.py DTRAIN -- TRAIN_ARGS...

Runs `DTRAIN train TRAIN_ARGS --trace FILE` (a --pp run) once in fp32 and once
with --mixed-precision bf16, and fails unless both exit 0, both sent the same
number of point-to-point messages between the stages, and every bf16 message
is half the size of the fp32 one in its place: activations and their
gradients cross in the compute dtype.
"""

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_dtrain import fail, run, say  # noqa: E402


def sends(trace_path):
    with open(trace_path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return sorted((e["pid"], e["args"]["seq"], e["args"]["bytes"]) for e in events if e.get("name") == "send")


def main():
    dtrain = sys.argv[1]
    args = sys.argv[3:] if sys.argv[2:3] == ["--"] else sys.argv[2:]
    with tempfile.TemporaryDirectory(prefix="dtrain-stage-dtype-") as folder:
        traces = {}
        for name, extra in (("fp32", []), ("bf16", ["--mixed-precision", "bf16"])):
            traces[name] = os.path.join(folder, name + ".json")
            run([dtrain, "train"] + args + extra + ["--trace", traces[name]])
        fp32, bf16 = sends(traces["fp32"]), sends(traces["bf16"])
    if not fp32:
        fail("the fp32 run's trace has no send between stages: is it a --pp run?")
    if len(fp32) != len(bf16):
        fail("%d messages between the stages in fp32 but %d in bf16" % (len(fp32), len(bf16)))
    for (rank, seq, full), (_, _, half) in zip(fp32, bf16):
        if 2 * half != full:
            fail("rank %d's send #%d: %d bytes in fp32 but %d with --mixed-precision bf16 (expected %d)" %
                 (rank, seq, full, half, full // 2))
    say("%d messages between the stages: %d bytes in fp32, %d in bf16" %
        (len(fp32), sum(s[2] for s in fp32), sum(s[2] for s in bf16)))


if __name__ == "__main__":
    main()
