#!/usr/bin/env python3
"""Each pipeline stage's peak memory, measured by `dtrain train --pp` and
predicted by `dtrain plan --pp`, for both schedules (issue 21).

Runs the same `dtrain train` job with --pp P --nproc N for each strategy of
--strategies and each schedule of --schedules, and reads every rank's peak
(the tracking allocator's, start and steps: the final metrics line's
peak_memory_bytes_per_rank). Next to each rank: `dtrain plan` for the same
flags and --rank r (its overall peak: the larger of the start's and a
step's), the moment of its step peak, and the microbatches it says the stage
holds at once. The median step time (after the first two steps) is printed
too; with --pp-gather microbatch among TRAIN_ARGS it shows what gathering
every unit per microbatch costs against once per step (the default).

    bench/pp_memory.py [--pp P] [--nproc N] [--microbatches M] [--strategies ddp,fsdp]
                       [--schedules 1f1b,gpipe] [--json OUT] DTRAIN -- TRAIN_ARGS...
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from train_run import run_train

# The flags of `dtrain train` that `dtrain plan` takes too (each with a value).
PLAN_FLAGS = {"--model", "--gpt-layers", "--gpt-dim", "--gpt-heads", "--seq-len", "--batch-size", "--optimizer",
              "--momentum", "--pp-gather"}


def plan(dtrain, train_args, strategy, nproc, pp, microbatches, schedule, rank):
    args = []
    for i, flag in enumerate(train_args[:-1]):
        if flag in PLAN_FLAGS:
            args += [flag, train_args[i + 1]]
    command = [dtrain, "plan"] + args + ["--strategy", strategy, "--nproc", str(nproc), "--pp", str(pp),
                                         "--microbatches", str(microbatches), "--schedule", schedule,
                                         "--rank", str(rank), "--json"]
    result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    return {"peak_bytes": result["peak_bytes"], "step_peak_bytes": result["step_peak_bytes"],
            "peak_moment": result["peak_moment"], "stage": result["pipeline"]["stage"],
            "microbatches_in_flight": result["pipeline"]["microbatches_in_flight"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dtrain")
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--strategies", default="ddp,fsdp")
    parser.add_argument("--schedules", default="1f1b,gpipe")
    parser.add_argument("--json")
    parser.add_argument("train_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        for strategy in args.strategies.split(","):
            for schedule in args.schedules.split(","):
                metrics = os.path.join(folder, f"{strategy}-{schedule}.jsonl")
                command = [args.dtrain, "train"] + train_args + [
                    "--strategy", strategy, "--pp", str(args.pp), "--nproc", str(args.nproc), "--microbatches",
                    str(args.microbatches), "--schedule", schedule, "--log-every", "1", "--metrics", metrics]
                steps, _, final = run_train(command, metrics)
                measured = final["peak_memory_bytes_per_rank"]
                ranks = []
                for rank, bytes_ in enumerate(measured):
                    planned = plan(args.dtrain, train_args, strategy, args.nproc, args.pp, args.microbatches,
                                   schedule, rank)
                    ranks.append({"rank": rank, "stage": planned["stage"], "measured_peak_bytes": bytes_,
                                  "planned_peak_bytes": planned["peak_bytes"],
                                  "ratio": bytes_ / planned["peak_bytes"],
                                  "planned_moment": planned["peak_moment"],
                                  "planned_microbatches_in_flight": planned["microbatches_in_flight"]})
                runs.append({"strategy": strategy, "schedule": schedule, "pp": args.pp, "nproc": args.nproc,
                             "microbatches": args.microbatches, "mesh": final["mesh"],
                             "gather": final["pipeline"].get("gather", "step"),
                             "step_time_s": statistics.median(steps) if steps else None, "ranks": ranks})
    print("%-6s %-6s %4s %5s %12s %12s %7s  %s" % ("strategy", "sched", "rank", "stage", "measured", "planned",
                                                   "ratio", "plan's moment"))
    for run in runs:
        print("%s %s, --pp-gather %s: median step %s s" % (run["strategy"], run["schedule"], run["gather"],
                                                           "%.3f" % run["step_time_s"] if run["step_time_s"] else "-"))
        for r in run["ranks"]:
            print("%-8s %-6s %4d %5d %9.1f MiB %9.1f MiB %7.3f  %s" % (
                run["strategy"], run["schedule"], r["rank"], r["stage"], r["measured_peak_bytes"] / 2**20,
                r["planned_peak_bytes"] / 2**20, r["ratio"], r["planned_moment"]))
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        with open(args.json, "w") as f:
            json.dump({"benchmark": "pp_memory", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "commit": commit, "command": " ".join(sys.argv), "runs": runs}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
