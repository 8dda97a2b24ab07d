#!/usr/bin/env python3
"""What checkpointing every N steps costs the steps, blocking vs --checkpoint-async.

Runs the same `dtrain train` job three times, taking turns for --rounds rounds:
without checkpoints, with blocking checkpoints every N steps, and with
--checkpoint-async every N steps (--log-every 1 --metrics). For each it reads:
  blocked    the seconds the training thread spent in each save (the metrics'
             {"step", "checkpoint_s"} records), mid-run saves only (the final
             save at the end waits for its write in both modes);
  cost       per mid-run checkpoint, what all the steps took beyond the run
             without checkpoints (sum of step_time_s + the mid-run
             checkpoint_s, minus the same steps of the run without), over the
             mid-run checkpoints: the blocked time plus what the background
             writer slowed the steps it overlapped (on 2 cores the writer
             competes with the ranks' compute). Noisy on a shared machine: a
             step's time varies more between runs than a save costs.
Target (issue 19, item 3): async's cost <= 10% of the blocking cost.

    bench/checkpoint_async.py [--rounds R] [--every N] [--json OUT] [--metrics-dir DIR [--from-metrics]] DTRAIN -- TRAIN_ARGS...
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time


def run(dtrain, args, metrics):
    command = [dtrain, "train"] + args + ["--log-every", "1", "--metrics", metrics]
    print("running: " + " ".join(command), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    return read(metrics)


def read(metrics):
    with open(metrics) as f:
        return [json.loads(line) for line in f if line.strip()]


def measure(records, every):
    steps = {r["step"]: r["step_time_s"] for r in records if "step_time_s" in r and not r.get("final")}
    saves = {r["step"]: r["checkpoint_s"] for r in records if "checkpoint_s" in r}
    last = max(steps)
    mid = sorted(s for s in saves if s < last)
    return steps, saves, mid


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--json")
    parser.add_argument("--metrics-dir", help="keep every run's metrics file here (default: a temporary folder)")
    parser.add_argument("--from-metrics", action="store_true", help="run nothing: summarise --metrics-dir's files")
    parser.add_argument("dtrain")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    load_before = os.getloadavg()[0]
    started = time.time()
    results = {"none": [], "sync": [], "async": []}
    staging_bytes = None
    with tempfile.TemporaryDirectory(prefix="dtrain-bench-ckpt-async-") as scratch:
        folder = options.metrics_dir or scratch
        if options.from_metrics and not options.metrics_dir:
            parser.error("--from-metrics needs --metrics-dir")
        os.makedirs(folder, exist_ok=True)
        for round_ in range(options.rounds):
            for mode in results:
                extra = []
                if mode != "none":
                    extra = ["--checkpoint-dir", os.path.join(folder, "%s-%d" % (mode, round_)),
                             "--checkpoint-every", str(options.every)]
                    if mode == "async":
                        extra.append("--checkpoint-async")
                metrics = os.path.join(folder, "%s-%d.jsonl" % (mode, round_))
                records = read(metrics) if options.from_metrics else run(options.dtrain, args + extra, metrics)
                results[mode].append(records)
                final = [r for r in records if r.get("final")][-1]
                if mode == "async":
                    staging_bytes = final.get("checkpoint_staging_bytes")
                    shutil.rmtree(os.path.join(folder, "%s-%d" % (mode, round_)), ignore_errors=True)
                elif mode == "sync":
                    shutil.rmtree(os.path.join(folder, "%s-%d" % (mode, round_)), ignore_errors=True)

    summary = {"rounds": options.rounds, "every": options.every, "args": args, "load_average_before": load_before,
               "seconds": time.time() - started, "staging_bytes": staging_bytes}
    for mode in ("sync", "async"):
        blocked, costs = [], []
        for records, baseline in zip(results[mode], results["none"]):
            steps, saves, mid = measure(records, options.every)
            base_steps = measure(baseline, options.every)[0]
            blocked += [saves[s] for s in mid]
            # Every step, so that the steps the last mid-run write overlaps count too.
            end = max(steps)
            spent = sum(steps[s] for s in range(1, end + 1)) + sum(saves[s] for s in mid)
            base = sum(base_steps[s] for s in range(1, end + 1))
            costs.append((spent - base) / len(mid))
        summary[mode] = {"blocked_s_median": statistics.median(blocked), "blocked_s": blocked,
                         "cost_per_checkpoint_s": costs, "cost_per_checkpoint_s_median": statistics.median(costs)}
    summary["step_time_s_median_without"] = statistics.median(
        r["step_time_s"] for records in results["none"] for r in records if "step_time_s" in r and not r.get("final"))
    summary["async_over_sync_blocked"] = summary["async"]["blocked_s_median"] / summary["sync"]["blocked_s_median"]
    summary["async_over_sync_cost"] = (summary["async"]["cost_per_checkpoint_s_median"]
                                       / summary["sync"]["cost_per_checkpoint_s_median"])
    summary["load_average_after"] = os.getloadavg()[0]
    text = json.dumps(summary, indent=1)
    print(text)
    if options.json:
        with open(options.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
