#!/usr/bin/env python3
"""Runs `dtrain plan ARGS --json` with --activation-checkpointing off and on
(the arguments: the dtrain binary, then the plan's flags) and checks that
checkpointing lowers the activations at the end of forward and the step's
peak, and leaves what does not depend on it (the state between steps, the
start, the units, the communication) as it was."""
import json
import subprocess
import sys


def plan(args, setting):
    out = subprocess.run(args + ["--activation-checkpointing", setting, "--json"], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)


def main():
    dtrain, flags = sys.argv[1], sys.argv[2:]
    args = [dtrain, "plan"] + flags
    off, on = plan(args, "off"), plan(args, "on")
    if off["activation_checkpointing"] is not False or on["activation_checkpointing"] is not True:
        sys.exit("activation_checkpointing is %r off and %r on" % (off["activation_checkpointing"],
                                                                     on["activation_checkpointing"]))
    for key in ("step_peak_bytes", "forward_activation_bytes"):
        if not 0 < on[key] < off[key]:
            sys.exit("%s: %d with activation checkpointing, %d without: it should be lower" % (key, on[key], off[key]))
    for key in ("between_steps", "construction_peak_bytes", "units", "collectives", "wire_bytes_per_step"):
        if on[key] != off[key]:
            sys.exit("%s differs with activation checkpointing: %r, without: %r" % (key, on[key], off[key]))
    print("ok: step peak %d -> %d bytes (%.2fx), activations after forward %d -> %d bytes (%s)"
          % (off["step_peak_bytes"], on["step_peak_bytes"], off["step_peak_bytes"] / on["step_peak_bytes"],
             off["forward_activation_bytes"], on["forward_activation_bytes"], on["peak_moment"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
