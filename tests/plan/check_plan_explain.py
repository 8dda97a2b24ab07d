#!/usr/bin/env python3
"""`dtrain plan --explain` (issue 40): the predicted step's timeline, read back
by `dtrain trace summary`, says what the plan says. Usage: DTRAIN PLAN-FLAGS..."""
import json
import os
import subprocess
import sys
import tempfile

dtrain, flags = sys.argv[1], sys.argv[2:]
with tempfile.TemporaryDirectory() as work:
    trace = os.path.join(work, "predicted.json")
    plan = json.loads(subprocess.run([dtrain, "plan", *flags, "--json", "--explain", trace], check=True,
                                     capture_output=True, text=True).stdout)
    summary = json.loads(subprocess.run([dtrain, "trace", "summary", trace, "--json"], check=True,
                                        capture_output=True, text=True).stdout)
time = plan["time"]
assert time is not None, "no predicted time in the plan"
ranks = summary if isinstance(summary, list) else summary.get("ranks", summary)
stages = plan["mesh"]["pp"]
assert len(ranks) == stages, "expected %d ranks in the trace, got %d" % (stages, len(ranks))


def close(a, b, what):
    assert abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1e-9), "%s: trace %r, plan %r" % (what, a, b)


for rank in ranks:  # every pipeline rank's step ends at the step's end
    close(rank["wall_ms"], time["seconds"] * 1e3, "rank %d wall" % rank["rank"])
    assert rank["steps"] == 1, rank
mine = [r for r in ranks if r["rank"] == plan["rank"]]
assert mine, "the planned rank %d is not in the trace" % plan["rank"]
close(mine[0]["compute_ms"], time["compute_seconds"] * 1e3, "compute")
close(mine[0]["exposed_comm_ms"], time["exposed_communication_seconds"] * 1e3, "exposed communication")
print("ok explain: %d rank(s), step %.3f ms, compute %.3f ms, exposed %.3f ms" %
      (len(ranks), time["seconds"] * 1e3, time["compute_seconds"] * 1e3, time["exposed_communication_seconds"] * 1e3))
