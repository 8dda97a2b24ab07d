#!/usr/bin/env python3
"""What --fp8 does on this CPU (issue 41), side by side in one run.

No fp8 arithmetic runs faster here (the emulation multiplies decoded fp8
values in fp32), so this measures what a CPU can say:

1. loss: a small GPT trained --steps steps with --fp8 off, tensorwise and
   rowwise (--fp8-min-width 0: every block layer in fp8), in fp32 and with
   --mixed-precision bf16; the mean loss of the last 10 steps of each, and
   its gap to the run without fp8 in the same precision;
2. wire bytes: `dtrain plan --json` of the 1.21B GPT of the GPU kit
   (24 x 2048, context 1024) under fsdp, bf16, on 8 ranks, with --fp8 off
   and tensorwise: the all-gathers' bytes per step and their ratio;
3. step time of the CPU emulation next to the run without fp8 (information
   only: it says what the emulation costs here, nothing of a GPU).

    bench/fp8_cpu.py [--steps 100] [--out bench/results/fp8_cpu.json] [DTRAIN]
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODEL = ["--model", "gpt", "--gpt-layers", "2", "--gpt-dim", "64", "--gpt-heads", "4", "--seq-len", "64",
         "--batch-size", "8", "--strategy", "single", "--samples", "0", "--eval-every", "0", "--log-every", "1"]
BIG = ["--model", "gpt", "--gpt-layers", "24", "--gpt-dim", "2048", "--gpt-heads", "16", "--seq-len", "1024",
       "--batch-size", "16", "--nproc", "8", "--strategy", "fsdp", "--mixed-precision", "bf16"]


def train(dtrain, folder, name, extra, steps):
    path = os.path.join(folder, name + ".jsonl")
    env = dict(os.environ, DTRAIN_THREADS_PER_RANK=os.environ.get("DTRAIN_THREADS_PER_RANK", "1"))
    subprocess.run([dtrain, "train"] + MODEL + ["--steps", str(steps), "--metrics", path] + extra, check=True,
                   stdout=subprocess.DEVNULL, env=env)
    rows = [json.loads(line) for line in open(path) if line.strip()]
    steps_rows = [r for r in rows if "step" in r and "loss" in r and not r.get("final")]
    return {"last10_loss": statistics.mean(r["loss"] for r in steps_rows[-10:]),
            "step_s_median": statistics.median(r["step_time_s"] for r in steps_rows[2:])}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dtrain", nargs="?", default="build/bin/dtrain")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", default="bench/results/fp8_cpu.json")
    args = parser.parse_args()
    result = {"date": datetime.date.today().isoformat(),
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True).stdout.strip(),
              "command": " ".join(["python3"] + sys.argv), "steps": args.steps, "loss": {}, "wire": {}}
    with tempfile.TemporaryDirectory(prefix="dtrain-fp8-bench-") as folder:
        for precision, extra in (("fp32", []), ("bf16", ["--mixed-precision", "bf16"])):
            runs = {}
            for scaling in ("off", "tensorwise", "rowwise"):
                runs[scaling] = train(args.dtrain, folder, precision + "-" + scaling,
                                      extra + ["--fp8", scaling, "--fp8-min-width", "0"], args.steps)
            base = runs["off"]["last10_loss"]
            for scaling, run in runs.items():
                run["loss_gap"] = (run["last10_loss"] - base) / base
                run["step_time_vs_off"] = run["step_s_median"] / runs["off"]["step_s_median"]
                print("%s %-10s last-10 loss %.4f (%+.2f%%), CPU step %.1f ms (%.2fx)" %
                      (precision, scaling, run["last10_loss"], 100 * run["loss_gap"], 1e3 * run["step_s_median"],
                       run["step_time_vs_off"]), flush=True)
            result["loss"][precision] = runs
    for scaling in ("off", "tensorwise"):
        out = subprocess.run([args.dtrain, "plan"] + BIG + ["--fp8", scaling, "--json"], check=True,
                             capture_output=True, text=True).stdout
        plan = json.loads(out[out.index("{"):])
        result["wire"][scaling] = {
            "all_gather_bytes": sum(c["payload_bytes"] for c in plan["collectives"] if c["op"] == "all_gather"),
            "step_peak_bytes": plan["step_peak_bytes"]}
    ratio = result["wire"]["tensorwise"]["all_gather_bytes"] / result["wire"]["off"]["all_gather_bytes"]
    result["wire"]["ratio"] = ratio
    print("1.21B GPT, fsdp bf16 on 8 ranks: all-gather bytes per step %d with --fp8 tensorwise, %d without (%.3fx);"
          " planned step peak %d vs %d bytes" %
          (result["wire"]["tensorwise"]["all_gather_bytes"], result["wire"]["off"]["all_gather_bytes"], ratio,
           result["wire"]["tensorwise"]["step_peak_bytes"], result["wire"]["off"]["step_peak_bytes"]))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("results: " + args.out)


if __name__ == "__main__":
    main()
