"""One `dtrain train` run for a benchmark script: run it quietly, read its
--metrics file, and return the per-step times and token rates after the
first two steps (warm-up) with the final line."""

import json
import subprocess


def run_train(command, metrics):
    """Runs `command` (which writes --metrics `metrics`); returns
    (step_time_s list, tokens_per_s list, final record), both lists from the third step on."""
    print("running: " + " ".join(command), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    with open(metrics) as f:
        records = [json.loads(line) for line in f]
    steps = [r["step_time_s"] for r in records if "step_time_s" in r and not r.get("final")]
    tokens = [r["tokens_per_s"] for r in records if "tokens_per_s" in r and not r.get("final")]
    return steps[2:], tokens[2:], records[-1]
