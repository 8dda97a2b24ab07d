#!/usr/bin/env python3
"""Tokens/s and MFU of a Llama-shaped model next to the GPT of about the same
parameter count, both under FSDP on this machine (issue 22).

Runs `dtrain train` with --strategy fsdp --nproc R on a token file of random
ids (the rate does not depend on the ids), once per model, and reports per
model: parameters, median step time and tokens/s (steps after the first two),
model FLOP/s and MFU. FLOPs per token are 6 per parameter (forward 2,
backward 4) plus attention's 12 x layers x seq x dim; the peak is R x one
core's fp32 GEMM rate, measured here (tests/long/gemm_rate.py), because the
ranks share the cores one thread each.

    bench/llama_vs_gpt.py [--ranks 2] [--steps 12] [--json OUT] DTRAIN

Default shapes: Llama 8 layers, dim 512, 8 heads sharing 2 key/value heads,
SwiGLU width 1408, untied head; GPT 8 layers, dim 512, 8 heads (its head is
tied, so it has fewer parameters: the report gives both counts); vocabulary
8192, windows of 256, a global batch of 8.
"""

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import random

from train_run import run_train

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = 8192
SEQ = 256
LAYERS = 8
DIM = 512


def gemm_rate():
    venv = os.environ.get("DTRAIN_TORCH_VENV", "/opt/dtrain/torch-2.15.0")
    python = os.path.join(venv, "bin", "python")
    output = subprocess.run([python if os.path.exists(python) else sys.executable,
                             os.path.join(HERE, "..", "tests", "long", "gemm_rate.py")],
                            check=True, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return json.loads(output.stdout.strip().splitlines()[-1])


def parameters(model):
    if model == "llama":
        ffn = 1408
        block = 2 * DIM + 2 * DIM * DIM + 2 * DIM * (DIM // 4) + 3 * DIM * ffn
        return 2 * VOCAB * DIM + LAYERS * block + DIM
    block = 12 * DIM * DIM + 13 * DIM
    return VOCAB * DIM + SEQ * DIM + LAYERS * block + 2 * DIM


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json")
    parser.add_argument("dtrain")
    args = parser.parse_args()
    gemm = gemm_rate()
    peak = gemm["gflops"] * 1e9 * args.ranks
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        data = os.path.join(folder, "tokens.bin")
        rng = random.Random(0)
        ids = [rng.randrange(VOCAB) for _ in range(400000)]
        with open(data, "wb") as f:
            f.write(struct.pack("<%dH" % len(ids), *ids))
        shapes = {
            "llama": ["--model", "llama", "--gpt-heads", "8", "--kv-heads", "2", "--ffn-dim", "1408"],
            "gpt": ["--model", "gpt", "--gpt-heads", "8"],
        }
        for model, flags in shapes.items():
            metrics = os.path.join(folder, model + ".jsonl")
            command = [args.dtrain, "train"] + flags + [
                "--gpt-layers", str(LAYERS), "--gpt-dim", str(DIM), "--vocab-size", str(VOCAB), "--seq-len", str(SEQ),
                "--data", "tokens:" + data, "--strategy", "fsdp", "--nproc", str(args.ranks), "--batch-size", "8",
                "--steps", str(args.steps), "--log-every", "1", "--eval-windows", str(args.ranks), "--metrics", metrics]
            steps, tokens, final = run_train(command, metrics)
            rate = statistics.median(tokens)
            count = parameters(model)
            flops_per_token = 6 * count + 12 * LAYERS * SEQ * DIM
            achieved = rate * flops_per_token
            rows.append({"model": model, "parameters": count, "step_s": statistics.median(steps), "tokens_per_s": rate,
                         "model_gflops": achieved / 1e9, "peak_gflops": peak / 1e9, "mfu": achieved / peak,
                         "peak_memory_bytes": final.get("peak_memory_bytes"), "command": " ".join(command)})
    print("| model | parameters | step (median) | tokens/s | model FLOP/s | MFU (of %d x %.1f GFLOP/s) |" %
          (args.ranks, gemm["gflops"]))
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %.1fM | %.3f s | %.0f | %.1f GFLOP/s | %.1f%% |" % (
            r["model"], r["parameters"] / 1e6, r["step_s"], r["tokens_per_s"], r["model_gflops"], 100 * r["mfu"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": args.ranks, "gemm": gemm, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
