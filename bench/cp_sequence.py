#!/usr/bin/env python3
"""Context parallelism (issue 39): the longest sequence that trains under a
per-rank memory cap at each cp, and the ring's exposed communication with its
overlap on and off.

For each cp of --cps, runs `dtrain train TRAIN_ARGS --seq-len T --cp cp
--nproc cp` (--strategy single at cp 1, ddp above: dp = 1, so the ranks
differ only in their shards of the sequence) with --batch-size 1 and reads
the steps' peak per rank (the tracking allocator's, the largest rank's) from
the final metrics line. T doubles from --start until a run's peak passes the
cap, then bisects down to a step of --resolution tokens (rounded to 2·cp):
the longest T that fits is reported next to cp 1's.

Then, at the longest T of cp 1, each cp > 1 runs with --trace twice,
--cp-overlap on and off, and reports the median step time and the ring's
waits (cp_ring_wait spans: the part of a key/value transfer the compute did
not hide), per rank and step, after the first two steps.

    bench/cp_sequence.py [--cap-mib 16] [--cps 1,2,4] [--start 512] [--resolution 128] [--json OUT]
                         DTRAIN -- TRAIN_ARGS...
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

from train_run import run_train


def train_command(dtrain, train_args, seq_len, cp, metrics, extra=()):
    strategy = "single" if cp == 1 else "ddp"
    return ([dtrain, "train"] + train_args + ["--seq-len", str(seq_len), "--batch-size", "1", "--nproc", str(cp),
                                              "--strategy", strategy, "--log-every", "1", "--metrics", metrics]
            + (["--cp", str(cp)] if cp > 1 else []) + list(extra))


def step_peak(dtrain, train_args, seq_len, cp, folder):
    metrics = os.path.join(folder, f"cp{cp}-{seq_len}.jsonl")
    _, _, final = run_train(train_command(dtrain, train_args, seq_len, cp, metrics), metrics)
    return final["step_peak_bytes"]


def longest_under(dtrain, train_args, cp, cap, start, resolution, folder):
    """The longest --seq-len (a multiple of 2·cp) whose step peak is at most `cap`, and the peaks tried."""
    unit = 2 * cp
    tried = {}

    def fits(t):
        tried[t] = step_peak(dtrain, train_args, t, cp, folder)
        print(f"  cp {cp}, {t} tokens: step peak {tried[t] / 2**20:.2f} MiB", flush=True)
        return tried[t] <= cap

    low, high = 0, start
    while fits(high):
        low, high = high, high * 2
    step = max(resolution // unit * unit, unit)
    while high - low > step:
        middle = (low + high) // 2 // unit * unit
        if middle <= low:
            break
        if fits(middle):
            low = middle
        else:
            high = middle
    return low, tried


def ring_waits(trace_path, skip=2):
    """Median over ranks and steps (after `skip`) of the seconds in cp_ring_wait per step."""
    with open(trace_path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    by_rank = {}
    for e in events:
        if e.get("ph") == "X":
            by_rank.setdefault(e["pid"], []).append((e["name"], e.get("cat", ""), float(e["ts"]), float(e["dur"])))
    per_step = []
    for spans in by_rank.values():
        steps = sorted((b, b + d) for name, cat, b, d in spans if name == "step" and cat == "step")
        for begin, end in steps[skip:]:
            per_step.append(sum(d for name, _, b, d in spans if name == "cp_ring_wait" and begin <= b < end) / 1e6)
    return statistics.median(per_step) if per_step else None


def overlap_runs(dtrain, train_args, seq_len, cp, folder):
    out = {}
    for overlap in ("on", "off"):
        metrics = os.path.join(folder, f"overlap-{cp}-{overlap}.jsonl")
        trace = os.path.join(folder, f"overlap-{cp}-{overlap}.json")
        steps, tokens, _ = run_train(train_command(dtrain, train_args, seq_len, cp, metrics,
                                                   ["--cp-overlap", overlap, "--trace", trace]), metrics)
        out[overlap] = {"step_time_s": statistics.median(steps), "ring_wait_s_per_step": ring_waits(trace)}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap-mib", type=float, default=16.0)
    parser.add_argument("--cps", default="1,2,4")
    parser.add_argument("--start", type=int, default=512)
    parser.add_argument("--resolution", type=int, default=128)
    parser.add_argument("--json")
    parser.add_argument("dtrain")
    parser.add_argument("train_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    train_args = [a for a in args.train_args if a != "--"]
    cps = [int(c) for c in args.cps.split(",")]
    cap = int(args.cap_mib * 2**20)
    results = {"cap_bytes": cap, "train_args": train_args, "longest": {}, "overlap": {}}
    with tempfile.TemporaryDirectory() as folder:
        for cp in cps:
            longest, tried = longest_under(args.dtrain, train_args, cp, cap, args.start, args.resolution, folder)
            results["longest"][cp] = {"seq_len": longest, "peaks": tried}
        base = results["longest"][cps[0]]["seq_len"]
        for cp in cps:
            if cp > 1 and base > 0:
                results["overlap"][cp] = overlap_runs(args.dtrain, train_args, base, cp, folder)
    print(f"\nlongest --seq-len with a step peak under {args.cap_mib:g} MiB per rank:")
    print("| cp | longest sequence | vs cp " + str(cps[0]) + " |\n|---|---|---|")
    for cp in cps:
        longest = results["longest"][cp]["seq_len"]
        print(f"| {cp} | {longest} | {longest / base:.2f}x |" if base else f"| {cp} | {longest} | - |")
    if results["overlap"]:
        print(f"\nthe ring at {base} tokens (median per step, after 2 warm-up steps):")
        print("| cp | overlap | step time | ring waits |\n|---|---|---|---|")
        for cp, runs in results["overlap"].items():
            for overlap, r in runs.items():
                wait = r["ring_wait_s_per_step"]
                print(f"| {cp} | {overlap} | {r['step_time_s'] * 1e3:.1f} ms | "
                      + (f"{wait * 1e3:.2f} ms |" if wait is not None else "- |"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
