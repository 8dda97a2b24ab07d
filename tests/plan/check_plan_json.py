#!/usr/bin/env python3
"""Runs `dtrain plan ... --json` (the arguments) and checks that stdout is one
JSON plan with the fields scripts read."""
import json
import subprocess
import sys

out = subprocess.run(sys.argv[1:], check=True, capture_output=True, text=True).stdout
plan = json.loads(out)
for key in ("strategy", "nproc", "shard_group_size", "peak_bytes", "peak", "between_steps", "units", "collectives",
            "wire_bytes_per_step"):
    assert key in plan, "missing %r in %s" % (key, out)
assert plan["step_peak_bytes"] == plan["peak"]["total"] > 0, plan
assert plan["construction_peak_bytes"] == plan["construction"]["total"] > 0, plan
assert plan["peak_bytes"] == max(plan["step_peak_bytes"], plan["construction_peak_bytes"]), plan
print("ok", plan["strategy"], plan["shard_group_size"], plan["peak_bytes"])
