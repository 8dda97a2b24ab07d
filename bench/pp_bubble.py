#!/usr/bin/env python3
"""The pipeline bubble, measured from the trace, against (pp-1)/(M+pp-1)
(issue 21; interleaved 1F1B's (pp-1)/(vM+pp-1), issue 39), and each stage's
peak memory under each schedule.

Runs the same `dtrain train` job with --pp P --nproc P --strategy single
(one rank per stage) for each schedule and each M of --microbatches, with
--trace and --metrics, and reports for each run:

- the bubble of each stage: within a step, the share of the pipeline's span
  (from the stage's first pipeline event to its last: forwards, backwards and
  the waits for the neighbour's activations or gradients) that the stage did
  not spend computing (pp_forward, pp_backward); the median over the steps
  after the first two. The ideal, with every microbatch's forward and
  backward equally long on every stage and free communication, is
  (P-1)/(M+P-1), and (P-1)/(vM+P-1) for interleaved 1F1B over v chunks
  per rank (--virtual-stages, used by the interleaved schedule only);
- the median step time and tokens per second;
- every stage's peak memory (the tracking allocator's, from the final
  metrics line): 1F1B keeps at most P microbatches' activations alive on the
  first stage, GPipe all M.

    bench/pp_bubble.py [--pp P] [--microbatches 2,4,8,16] [--schedules 1f1b,gpipe,interleaved]
                       [--virtual-stages V] [--json OUT] DTRAIN -- TRAIN_ARGS...
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from train_run import run_train


def spans_by_rank(trace_path):
    """{rank: [(name, category, begin_us, end_us), ...]} of the complete events."""
    with open(trace_path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    out = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        out.setdefault(e["pid"], []).append((e["name"], e.get("cat", ""), float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    return out


def bubble_of_stage(spans, skip):
    """Median over the steps after `skip` of the stage's idle share of its pipeline span."""
    steps = sorted((b, e) for name, cat, b, e in spans if name == "step" and cat == "step")
    bubbles = []
    for begin, end in steps[skip:]:
        inside = [(n, b, e) for n, _, b, e in spans if n.startswith("pp_") and n != "pp_send_drain" and b >= begin and e <= end]
        if not inside:
            continue
        window = max(e for _, _, e in inside) - min(b for _, b, _ in inside)
        busy = sum(e - b for n, b, e in inside if n in ("pp_forward", "pp_backward"))
        bubbles.append(1 - busy / window if window > 0 else 0.0)
    return statistics.median(bubbles) if bubbles else None


def run(dtrain, train_args, pp, microbatches, schedule, chunks, folder):
    metrics = os.path.join(folder, f"{schedule}-{microbatches}.jsonl")
    trace = os.path.join(folder, f"{schedule}-{microbatches}.json")
    command = [dtrain, "train"] + train_args + ["--pp", str(pp), "--nproc", str(pp), "--strategy", "single",
                                                "--microbatches", str(microbatches), "--schedule", schedule,
                                                "--log-every", "1", "--metrics", metrics, "--trace", trace]
    chunks = chunks if schedule == "interleaved" else 1
    if chunks > 1:
        command += ["--virtual-stages", str(chunks)]
    steps, tokens, final = run_train(command, metrics)
    spans = spans_by_rank(trace)
    return {"schedule": schedule, "microbatches": microbatches, "pp": pp, "virtual_stages": chunks,
            "ideal_bubble": (pp - 1) / (chunks * microbatches + pp - 1),
            "bubble_per_stage": [bubble_of_stage(spans[rank], 2) for rank in sorted(spans)],
            "step_time_s": statistics.median(steps), "tokens_per_s": statistics.median(tokens),
            "peak_bytes_per_stage": final["peak_memory_bytes_per_rank"], "mesh": final["mesh"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dtrain")
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--microbatches", default="2,4,8,16")
    parser.add_argument("--schedules", default="1f1b,gpipe")
    parser.add_argument("--virtual-stages", type=int, default=2)
    parser.add_argument("--json")
    parser.add_argument("train_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    train_args = [a for a in args.train_args if a != "--"]
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for schedule in args.schedules.split(","):
            for m in [int(x) for x in args.microbatches.split(",")]:
                results.append(run(args.dtrain, train_args, args.pp, m, schedule, args.virtual_stages, folder))
    print(f"\n{'schedule':14} {'M':>3} {'ideal bubble':>12} {'measured per stage':>22} {'step s':>8} "
          f"{'tokens/s':>9}  peak MiB per stage")
    for r in results:
        measured = " ".join(f"{b:.3f}" if b is not None else "-" for b in r["bubble_per_stage"])
        peaks = " ".join(f"{p / 2**20:.1f}" for p in r["peak_bytes_per_stage"])
        name = r["schedule"] + (f" v={r['virtual_stages']}" if r["virtual_stages"] > 1 else "")
        print(f"{name:14} {r['microbatches']:>3} {r['ideal_bubble']:>12.3f} {measured:>22} "
              f"{r['step_time_s']:>8.3f} {r['tokens_per_s']:>9.0f}  {peaks}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "command": "bench/pp_bubble.py " + " ".join(
                sys.argv[1:]), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
