#!/usr/bin/env python3
"""Memory and step time of one GPT on each (dp, tp) mesh of N ranks (issue 20).

Runs the same `dtrain train` job (--log-every 1 --metrics) once per mesh:
--tp T --nproc N for every T dividing N that the GPT allows, taking turns for
--rounds rounds, and reports for each: every rank's peak memory (the final
metrics line's peak_memory_bytes_per_rank: the tracking allocator's peak,
start and steps), the median step time over the steps after the first two,
and tokens per second. With tp, a rank holds 1/tp of each block's weights and
of the activations inside attention and the MLP (its heads, its part of the
hidden layer); the residual stream, LayerNorms and the loss's inputs stay
whole on every rank of the group.

With --sequence-parallel the tp > 1 runs also split those replicated
activations along the sequence (dtrain train --sequence-parallel).

Next to each measurement: `dtrain plan` for the same flags and mesh (its
training step's peak against the measured step peak, the final metrics'
step_peak_bytes, the largest rank's), and the bytes the plan says each
dimension sends per step (dp: FSDP's gathers and reductions over the dp
group; tp: the activations' collectives over the tp group).

    bench/tp_mesh.py [--nproc N] [--rounds R] [--sequence-parallel] [--json OUT] DTRAIN -- TRAIN_ARGS...
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

from train_run import run_train


def run(dtrain, args, metrics):
    steps, tokens, final = run_train([dtrain, "train"] + args + ["--log-every", "1", "--metrics", metrics], metrics)
    return {"step_time_s": steps, "tokens_per_s": tokens, "peak_bytes_per_rank": final["peak_memory_bytes_per_rank"],
            "construction_peak_bytes": final["construction_peak_bytes"], "step_peak_bytes": final["step_peak_bytes"],
            "mesh": final["mesh"]}


# The flags of `dtrain train` that `dtrain plan` takes too (each with a value).
PLAN_FLAGS = {"--model", "--gpt-layers", "--gpt-dim", "--gpt-heads", "--seq-len", "--strategy", "--batch-size",
              "--mixed-precision", "--optimizer", "--momentum"}


def plan(dtrain, train_args, nproc, tp, sequence_parallel):
    args = []
    for i, flag in enumerate(train_args[:-1]):
        if flag in PLAN_FLAGS:
            args += [flag, train_args[i + 1]]
    command = [dtrain, "plan"] + args + ["--nproc", str(nproc), "--tp", str(tp), "--json"]
    if sequence_parallel:
        command.append("--sequence-parallel")
    result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    tp_sent = sum(c["wire_bytes"] for c in result["collectives"] if "tensor parallel" in c["what"])
    return {"step_peak_bytes": result["step_peak_bytes"], "construction_peak_bytes": result["construction_peak_bytes"],
            "dp_wire_bytes": result["wire_bytes_per_step"] - tp_sent, "tp_wire_bytes": tp_sent}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("dtrain")
    parser.add_argument("train_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    train_args = [a for a in args.train_args if a != "--"]
    meshes = [tp for tp in range(1, args.nproc + 1) if args.nproc % tp == 0 and 256 % tp == 0]
    results = {tp: [] for tp in meshes}
    start = time.time()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        for round_index in range(args.rounds):
            for tp in meshes:
                metrics = os.path.join(folder, f"tp{tp}-{round_index}.jsonl")
                extra = ["--sequence-parallel"] if args.sequence_parallel and tp > 1 else []
                results[tp].append(run(args.dtrain, train_args + ["--nproc", str(args.nproc), "--tp", str(tp)] + extra,
                                       metrics))
    summary = {"nproc": args.nproc, "args": train_args, "rounds": args.rounds,
               "sequence_parallel": args.sequence_parallel, "load_average_before": load_before,
               "load_average_after": os.getloadavg()[0], "seconds": time.time() - start, "meshes": []}
    print(f"\n| mesh (dp, tp) | peak memory per rank | start peak | median step | tokens/s | step peak: measured / dtrain plan "
          f"| plan: sent per step, dp / tp |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for tp in meshes:
        runs = results[tp]
        steps = [s for r in runs for s in r["step_time_s"]]
        tokens = [t for r in runs for t in r["tokens_per_s"]]
        peak = max(max(r["peak_bytes_per_rank"]) for r in runs)
        start_peak = max(r["construction_peak_bytes"] for r in runs)
        row = {"dp": args.nproc // tp, "tp": tp, "peak_bytes_per_rank_max": peak, "construction_peak_bytes": start_peak,
               "step_time_s_median": statistics.median(steps), "tokens_per_s_median": statistics.median(tokens),
               "peak_bytes_per_rank": [r["peak_bytes_per_rank"] for r in runs]}
        planned = plan(args.dtrain, train_args, args.nproc, tp, args.sequence_parallel and tp > 1)
        step_peak = max(r["step_peak_bytes"] for r in runs)
        row.update({"step_peak_bytes": step_peak, "plan": planned,
                    "step_peak_over_plan": step_peak / planned["step_peak_bytes"]})
        summary["meshes"].append(row)
        print(f"| ({row['dp']}, {tp}) | {peak / 2**20:.1f} MiB | {start_peak / 2**20:.1f} MiB | "
              f"{row['step_time_s_median']:.3f} s | {row['tokens_per_s_median']:.0f} | "
              f"{step_peak / 2**20:.1f} / {planned['step_peak_bytes'] / 2**20:.1f} MiB ({row['step_peak_over_plan']:.3f}) | "
              f"{planned['dp_wire_bytes'] / 2**20:.1f} / {planned['tp_wire_bytes'] / 2**20:.1f} MiB |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
