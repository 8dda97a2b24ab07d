#!/usr/bin/env python3
"""Per-rank peak memory of whole `dtrain train` runs, the start included (issue 15).

    python3 bench/start_memory.py [--dtrain build/bin/dtrain] [--world-sizes 4,8]
                                  [--strategies fsdp,zero2,hsdp,ddp] [--cap-search]
                                  [--json bench/results/start-memory.json]

For a 100M-parameter GPT (12 layers, dim 832, 8 heads, 64-token windows, one
window per rank, AdamW, fp32), each strategy trains 2 steps at each world
size; the final metrics line gives the start's peak (building the model,
`construction_peak_bytes`), the steps' peak and the overall peak per rank,
and `dtrain plan` predicts each for the same run. The table gives them side
by side and the overall peak as a fraction of DDP's at the same world size.

--cap-search: the largest GPT of width 1024 (16 heads) that `dtrain plan`
says trains under a 1 GiB per-rank cap (DTRAIN_MEMORY_CAP_MB=1024) at 4 ranks
under fsdp with AdamW, then that model trained 2 steps under the cap, and the
next larger one (which should stop with the cap's message).

Nothing here asserts a number; the figures go to docs/PERFORMANCE.md.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MODEL = ["--model", "gpt", "--gpt-layers", "12", "--gpt-dim", "832", "--gpt-heads", "8", "--seq-len", "64"]
TRAIN_ONLY = ["--steps", "2", "--samples", "0", "--log-every", "1"]
MIB = 1024 * 1024
STRATEGY_ORDER = ["ddp", "fsdp", "zero2", "hsdp", "zero1"]


def plan(dtrain, model, strategy, nproc, batch):
    command = [dtrain, "plan", "--strategy", strategy, "--nproc", str(nproc), "--batch-size", str(batch), "--json"]
    if strategy == "hsdp":
        command += ["--hybrid-group-size", str(nproc // 2 if nproc % 2 == 0 and nproc >= 4 else nproc)]
    output = subprocess.run(command + model, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(output)


def train(dtrain, model, strategy, nproc, batch, cap_mb=None):
    """Returns (final record or None, seconds, output tail)."""
    with tempfile.TemporaryDirectory() as workdir:
        metrics = os.path.join(workdir, "m.jsonl")
        env = dict(os.environ)
        env.pop("DTRAIN_MEMORY_CAP_MB", None)
        if cap_mb:
            env["DTRAIN_MEMORY_CAP_MB"] = str(cap_mb)
        command = [dtrain, "train", "--strategy", strategy, "--nproc", str(nproc), "--batch-size", str(batch),
                   "--eval-windows", str(nproc), "--metrics", metrics] + TRAIN_ONLY + model
        print("start_memory: " + " ".join(command) + (" (cap %s MiB)" % cap_mb if cap_mb else ""), flush=True)
        started = time.time()
        result = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seconds = time.time() - started
        tail = result.stdout[-1500:]
        if result.returncode != 0:
            return None, seconds, tail
        with open(metrics) as f:
            return json.loads(f.readlines()[-1]), seconds, tail


def scaling(args):
    rows = []
    for nproc in args.world_sizes:
        # Without a DDP run (8 DDP replicas of this model do not fit in this
        # machine's memory), the reference is DDP's plan, which matched the
        # measured DDP peak to 0.01% wherever both were taken.
        ddp_overall, ddp_reference = None, "measured"
        if "ddp" not in args.strategies:
            ddp_overall, ddp_reference = plan(args.dtrain, MODEL, "ddp", nproc, nproc)["peak_bytes"], "plan"
        for strategy in ["ddp"] + [s for s in args.strategies if s != "ddp"]:
            if strategy not in args.strategies:
                continue
            planned = plan(args.dtrain, MODEL, strategy, nproc, nproc)
            final, seconds, tail = train(args.dtrain, MODEL, strategy, nproc, nproc)
            if final is None:
                sys.exit("start_memory: %s on %d ranks failed:\n%s" % (strategy, nproc, tail))
            row = dict(strategy=strategy, world_size=nproc, seconds=round(seconds, 1),
                       parameters=final["parameters"],
                       measured_start_bytes=final["construction_peak_bytes"],
                       measured_step_bytes=final["step_peak_bytes"],
                       measured_overall_bytes=final["peak_memory_bytes"],
                       planned_start_bytes=planned["construction_peak_bytes"],
                       planned_step_bytes=planned["step_peak_bytes"],
                       planned_overall_bytes=planned["peak_bytes"],
                       planned_start_moment=planned["construction_moment"])
            if strategy == "ddp":
                ddp_overall = row["measured_overall_bytes"]
            row["overall_vs_ddp"] = row["measured_overall_bytes"] / ddp_overall if ddp_overall else None
            row["ddp_reference"] = ddp_reference
            rows.append(row)
            print("start_memory: %s" % json.dumps(row), flush=True)
    return rows


def cap_search(args):
    width = ["--gpt-dim", "1024", "--gpt-heads", "16", "--seq-len", "64"]
    cap = 1024 * MIB
    fits = None
    for layers in range(1, 64):
        model = ["--model", "gpt", "--gpt-layers", str(layers)] + width
        if plan(args.dtrain, model, "fsdp", 4, 4)["peak_bytes"] >= cap:
            break
        fits = layers
    result = dict(cap_bytes=cap, world_size=4, strategy="fsdp", optimizer="adamw", width=1024, runs=[])
    for layers in (fits, fits + 1):
        model = ["--model", "gpt", "--gpt-layers", str(layers)] + width
        planned = plan(args.dtrain, model, "fsdp", 4, 4)
        final, seconds, tail = train(args.dtrain, model, "fsdp", 4, 4, cap_mb=1024)
        run = dict(layers=layers, parameters=planned["parameters"], planned_overall_bytes=planned["peak_bytes"],
                   planned_start_bytes=planned["construction_peak_bytes"], planned_step_bytes=planned["step_peak_bytes"],
                   trained=final is not None, seconds=round(seconds, 1))
        if final:
            run.update(measured_overall_bytes=final["peak_memory_bytes"],
                       measured_start_bytes=final["construction_peak_bytes"],
                       measured_step_bytes=final["step_peak_bytes"])
        else:
            run["error"] = next((line for line in tail.splitlines() if "out of memory" in line), tail.splitlines()[-1])
        result["runs"].append(run)
        print("start_memory: %s" % json.dumps(run), flush=True)
    return result


def print_table(rows):
    print("\n| ranks | strategy | start: measured / plan | step: measured / plan | overall: measured / plan | overall / DDP's |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| %d | %s | %.1f / %.1f MiB | %.1f / %.1f MiB | %.1f / %.1f MiB | %.3fx%s |" % (
            r["world_size"], r["strategy"], r["measured_start_bytes"] / MIB, r["planned_start_bytes"] / MIB,
            r["measured_step_bytes"] / MIB, r["planned_step_bytes"] / MIB, r["measured_overall_bytes"] / MIB,
            r["planned_overall_bytes"] / MIB, r["overall_vs_ddp"],
            " (DDP's plan)" if r.get("ddp_reference") == "plan" else ""))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtrain", default="build/bin/dtrain")
    parser.add_argument("--world-sizes", default="4,8")
    parser.add_argument("--strategies", default="fsdp,zero2,hsdp,ddp")
    parser.add_argument("--cap-search", action="store_true")
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--json", default="bench/results/start-memory.json")
    args = parser.parse_args()
    args.world_sizes = [int(n) for n in args.world_sizes.split(",")]
    args.strategies = args.strategies.split(",")
    record = dict(command="python3 bench/start_memory.py " + " ".join(sys.argv[1:]), date_utc=time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                  model=" ".join(MODEL), train=" ".join(TRAIN_ONLY))
    if os.path.exists(args.json):
        with open(args.json) as f:
            previous = json.load(f)
        record = {**previous, **record}
    if not args.skip_scaling:
        fresh = scaling(args)
        kept = [r for r in record.get("rows", [])
                if (r["world_size"], r["strategy"]) not in {(f["world_size"], f["strategy"]) for f in fresh}]
        record["rows"] = sorted(kept + fresh, key=lambda r: (r["world_size"], STRATEGY_ORDER.index(r["strategy"])))
        print_table(record["rows"])
    if args.cap_search:
        record["cap_search"] = cap_search(args)
    with open(args.json + ".partial", "w") as out:
        json.dump(record, out, indent=2)
        out.write("\n")
    os.replace(args.json + ".partial", args.json)
    print("start_memory: wrote " + args.json)


if __name__ == "__main__":
    main()
