"""Puts `dtrain bench ddp` and bench/peers/ddp_peer.py results side by side.

    python bench/ddp_compare.py [--json combined.json] [--train METRICS.jsonl...] RESULT.json...

Each RESULT.json is one run of either; rows are matched by model and mode.
Each --train file is the metrics of a `dtrain train --strategy ddp` run of
the same model and per-rank batch: its median step becomes the "train-ddp"
row, next to the engine's "ddp" row (the difference is the trainer's own
cost per step: data, schedule, logging, checks; issue 36).
Prints one table (step times, ratios to each side's own ideal, dtrain /
PyTorch: bench/report.py's "ddp" block) and the issue's targets as
measured; it reports, never asserts.
"""
import argparse
import json
import os
import sys

from report import ddp_table

MODES = ("ideal", "naive", "ddp", "ddp-bf16", "train-ddp")


def load(paths):
    rows, runs = {}, {}
    for path in paths:
        with open(path) as f:
            document = json.load(f)
        side = document["implementation"]
        runs.setdefault(side, []).append({k: v for k, v in document.items() if k != "results"})
        for row in document["results"]:
            rows[(side, row["model"], row["mode"])] = row
    return rows, runs


def load_train(paths, rows, runs):
    """The final line of each `dtrain train` metrics file as a dtrain "train-ddp" row."""
    for path in paths:
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
        final = next((r for r in reversed(records) if r.get("final")), None)
        if final is None or final.get("strategy") != "ddp":
            sys.exit(f"ddp_compare: {path} has no final line of a --strategy ddp run of dtrain train")
        model = final["model"]
        engine = rows.get(("dtrain", model, "ddp"))
        rows[("dtrain", model, "train-ddp")] = dict(
            model=model, mode="train-ddp", parameters=final["parameters"],
            batch_per_rank=final["batch_size"] // final["world_size"], step_s=final["step_time_s_median"],
            ratio_to_ideal=None, exposed_comm_s=None,
            bytes_sent_per_step=engine["bytes_sent_per_step"] if engine else 0)
        runs.setdefault("dtrain train", []).append({k: final[k] for k in ("model", "world_size", "steps")})


def check_same_workload(rows, model):
    """Refuse to compare runs whose models or batches differ."""
    seen = {(r["parameters"], r["batch_per_rank"]) for (side, m, _), r in rows.items() if m == model}
    if len(seen) > 1:
        sys.exit(f"ddp_compare: the {model} runs differ in (parameters, batch per rank): {sorted(seen)}; "
                 "apps/dtrain/bench_ddp.cpp and bench/peers/ddp_peer.py must build the same workload")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="also write the combined rows and targets as JSON to this path")
    parser.add_argument("--train", action="append", default=[], help="metrics of a dtrain train --strategy ddp run")
    parser.add_argument("results", nargs="+")
    args = parser.parse_args()
    rows, runs = load(args.results)
    load_train(args.train, rows, runs)
    models = [m for m in ("mlp", "gpt") if any(key[1] == m for key in rows)]

    combined = []
    for model in models:
        check_same_workload(rows, model)
        for mode in MODES:
            d = rows.get(("dtrain", model, mode))
            # The trainer's row is compared with PyTorch's DDP, the engine's peer.
            p = rows.get(("pytorch", model, "ddp" if mode == "train-ddp" else mode))
            if d is None and (p is None or mode == "train-ddp"):
                continue
            any_row = d or p
            if d is not None and d["ratio_to_ideal"] is None and ("dtrain", model, "ideal") in rows:
                d = dict(d, ratio_to_ideal=d["step_s"] / rows[("dtrain", model, "ideal")]["step_s"])
            row = dict(model=model, mode=mode, parameters=any_row["parameters"],
                       batch_per_rank=any_row["batch_per_rank"],
                       dtrain_step_s=d and d["step_s"], dtrain_ratio_to_ideal=d and d["ratio_to_ideal"],
                       pytorch_step_s=p and p["step_s"], pytorch_ratio_to_ideal=p and p["ratio_to_ideal"],
                       dtrain_over_pytorch=d["step_s"] / p["step_s"] if d and p else None,
                       dtrain_exposed_comm_s=d and d["exposed_comm_s"],
                       bytes_sent_per_step=any_row["bytes_sent_per_step"])
            combined.append(row)

    def get(model, mode, key):
        return next((r[key] for r in combined if r["model"] == model and r["mode"] == mode), None)

    # The targets, as measured.
    targets = []

    def target(text, value, limit, met):
        targets.append(dict(target=text, measured=value, limit=limit, met=met))

    gpt_ratio = get("gpt", "ddp", "dtrain_ratio_to_ideal")
    if gpt_ratio is not None:
        target("gpt: dtrain DDP / ideal <= 1.10", gpt_ratio, 1.10, gpt_ratio <= 1.10)
    for model in models:
        ddp, naive = get(model, "ddp", "dtrain_step_s"), get(model, "naive", "dtrain_step_s")
        if ddp is not None and naive is not None:
            target(f"{model}: dtrain DDP faster than naive (DDP / naive)", ddp / naive, 1.0, ddp < naive)
    for model, limit in (("mlp", 0.8), ("gpt", 1.0)):
        value = get(model, "ddp", "dtrain_over_pytorch")
        if value is not None:
            target(f"{model}: dtrain DDP / PyTorch DDP <= {limit}", value, limit, value <= limit)
    for model in models:
        train, engine = get(model, "train-ddp", "dtrain_step_s"), get(model, "ddp", "dtrain_step_s")
        if train is not None and engine is not None:
            target(f"{model}: dtrain train DDP / dtrain's DDP engine (the trainer's own cost) <= 1.05",
                   train / engine, 1.05, train / engine <= 1.05)
    # The table docs/PERFORMANCE.md shows, written by the same code.
    print("\n".join(ddp_table(dict(rows=combined, targets=targets), "ddp_compare")))
    for model in models:
        exposed = get(model, "ddp", "dtrain_exposed_comm_s")
        step = get(model, "ddp", "dtrain_step_s")
        if exposed is not None:
            print(f"- {model}: dtrain DDP exposed communication {exposed * 1e3:.1f} ms per step "
                  f"({exposed / step:.0%} of the step)")
        ideal_ratio = get(model, "ideal", "dtrain_over_pytorch")
        if ideal_ratio is not None:
            print(f"- {model}: ideal (no communication) dtrain / PyTorch {ideal_ratio:.3f} "
                  "(same kernels; shows how much the two runs' machine state differed)")

    if args.json:
        partial = args.json + ".partial"
        with open(partial, "w") as out:
            json.dump(dict(runs=runs, rows=combined, targets=targets), out, indent=2)
            out.write("\n")
        os.replace(partial, args.json)


if __name__ == "__main__":
    main()
