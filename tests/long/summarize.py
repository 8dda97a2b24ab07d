"""Summarise make check-long's runs as markdown; exit 1 if a check fails.

  summarize.py OUT_DIR --min-accuracy 0.90 --ranks 2 --cnn-epochs 10

Reads OUT_DIR/{cnn-ddp,cnn-fsdp,gpt-fsdp}.jsonl (dtrain train --metrics),
their .seconds files (wall time of the whole command), gpt-plan.json
(dtrain plan: parameter count) and gemm.json (tests/long/gemm_rate.py).
"""
import argparse
import json
import pathlib
import statistics
import sys


def lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def final(records, path):
    last = records[-1] if records else {}
    if not last.get("final"):
        sys.exit(f"check-long: {path} has no final metrics line; the run did not finish")
    return last


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--min-accuracy", type=float, required=True)
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--cnn-epochs", type=int, required=True)
    args = parser.parse_args()
    failures = []

    print("| CNN, Fashion-MNIST | epochs | steps | test accuracy | test loss | wall time | median step | peak memory/rank |")
    print("|---|---|---|---|---|---|---|---|")
    accuracy = {}
    for strategy in ("ddp", "fsdp"):
        path = args.out / f"cnn-{strategy}.jsonl"
        last = final(lines(path), path)
        seconds = float((args.out / f"cnn-{strategy}.seconds").read_text())
        accuracy[strategy] = last["eval_accuracy"]
        print(f"| {strategy}, {last['world_size']} ranks | {args.cnn_epochs} | {last['steps']} "
              f"| {100 * last['eval_accuracy']:.2f}% | {last['eval_loss']:.4f} | {seconds:.0f} s "
              f"| {1000 * last['step_time_s_median']:.1f} ms | {last['peak_memory_bytes'] / 2**20:.1f} MiB |")
        if last["eval_accuracy"] < args.min_accuracy:
            failures.append(f"CNN under {strategy}: test accuracy {last['eval_accuracy']:.4f} "
                            f"< {args.min_accuracy}")
    if abs(accuracy["ddp"] - accuracy["fsdp"]) > 0.005:
        failures.append(f"CNN: DDP and FSDP accuracies differ by more than 0.5 points ({accuracy})")

    records = lines(args.out / "gpt-fsdp.jsonl")
    last = final(records, "gpt-fsdp.jsonl")
    plan = json.loads((args.out / "gpt-plan.json").read_text())
    gemm = json.loads((args.out / "gemm.json").read_text())
    # Skip the first logged interval (warm-up: first allocations, first gathers).
    rates = [r["tokens_per_s"] for r in records if "tokens_per_s" in r][1:]
    tokens_per_s = statistics.median(rates)
    model = plan["model"]
    layers, dim, seq = (int(x) for x in
                        (model.split(" layers")[0].split()[-1], model.split("dim ")[1].split(",")[0],
                         model.split("seq_len ")[1].split(",")[0]))
    # Training FLOPs per token: 6 per parameter (forward 2, backward 4; the
    # tied output head is a matmul over the embedding; the position table, a
    # lookup, is counted too: about 1% here) plus attention's
    # scores and weighted sum, 12 * layers * seq_len * dim (PaLM's appendix B).
    flops_per_token = 6 * plan["parameters"] + 12 * layers * seq * dim
    achieved = tokens_per_s * flops_per_token
    peak = gemm["gflops"] * 1e9 * args.ranks
    print()
    print("| GPT | parameters | tokens/s | model FLOP/s | peak (ranks x 1-core fp32 GEMM) | MFU |")
    print("|---|---|---|---|---|---|")
    print(f"| {model}, fsdp on {args.ranks} ranks | {plan['parameters'] / 1e6:.1f}M | {tokens_per_s:,.0f} "
          f"| {achieved / 1e9:.2f} GFLOP/s | {peak / 1e9:.1f} GFLOP/s ({gemm['gflops']:.1f} per core) "
          f"| {100 * achieved / peak:.1f}% |")
    if failures:
        print("\ncheck-long FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\ncheck-long: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
