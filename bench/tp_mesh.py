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

    bench/tp_mesh.py [--nproc N] [--rounds R] [--sequence-parallel] [--json OUT] DTRAIN -- TRAIN_ARGS...
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time


def run(dtrain, args, metrics):
    command = [dtrain, "train"] + args + ["--log-every", "1", "--metrics", metrics]
    print("running: " + " ".join(command), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    with open(metrics) as f:
        records = [json.loads(line) for line in f]
    steps = [r["step_time_s"] for r in records if "step_time_s" in r and not r.get("final")]
    tokens = [r["tokens_per_s"] for r in records if "tokens_per_s" in r and not r.get("final")]
    final = records[-1]
    return {"step_time_s": steps[2:], "tokens_per_s": tokens[2:], "peak_bytes_per_rank": final["peak_memory_bytes_per_rank"],
            "construction_peak_bytes": final["construction_peak_bytes"], "mesh": final["mesh"]}


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
    print(f"\n| mesh (dp, tp) | peak memory per rank | start peak | median step | tokens/s |")
    print("|---|---:|---:|---:|---:|")
    for tp in meshes:
        runs = results[tp]
        steps = [s for r in runs for s in r["step_time_s"]]
        tokens = [t for r in runs for t in r["tokens_per_s"]]
        peak = max(max(r["peak_bytes_per_rank"]) for r in runs)
        start_peak = max(r["construction_peak_bytes"] for r in runs)
        row = {"dp": args.nproc // tp, "tp": tp, "peak_bytes_per_rank_max": peak, "construction_peak_bytes": start_peak,
               "step_time_s_median": statistics.median(steps), "tokens_per_s_median": statistics.median(tokens),
               "peak_bytes_per_rank": [r["peak_bytes_per_rank"] for r in runs]}
        summary["meshes"].append(row)
        print(f"| ({row['dp']}, {tp}) | {peak / 2**20:.1f} MiB | {start_peak / 2**20:.1f} MiB | "
              f"{row['step_time_s_median']:.3f} s | {row['tokens_per_s_median']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
