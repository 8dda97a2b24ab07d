#!/usr/bin/env python3
"""`dtrain train --init-from FILE.safetensors` starts from the file's weights.

    check_init_from.py SAVE_INITIAL_WEIGHTS DTRAIN

1. The MLP that --seed 1 builds, saved to a file, then trained with --seed 2
   --init-from FILE on 2 ranks (DDP) gives the loss curve of a plain --seed 1
   run on one rank (--shuffle false, so the seed only picks the weights), and
   a --seed 2 run without the file does not.
2. All-zero weights give uniform logits: the first loss is exactly ln(10) for
   the MLP and ln(256) for the byte GPT (FSDP, 2 ranks: the file is loaded
   before the model is sharded).
3. A file that does not fit the model, or is not a safetensors file, exits 2
   before any rank starts, naming --init-from.
4. The GPT's --seed 1 file loaded under --tp 2 (FSDP on a (2, 2) mesh, and
   one replica on (1, 2)) reproduces the single-process --seed 1 losses.
5. So does a 2-block GPT's file under --pp 2: FSDP on a (dp, pp) = (2, 2)
   mesh, and DDP on (1, 2, 2) with tensor parallelism inside the stages.
"""

import math
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_train import fail, read_metrics, train  # noqa: E402

MLP_ANY_WIDTH = ["--model", "mlp", "--batch-size", "16", "--optimizer", "sgd", "--lr", "0.1", "--shuffle", "false",
                 "--log-every", "1"]
MLP = MLP_ANY_WIDTH + ["--mlp-hidden", "32"]
GPT = ["--model", "gpt", "--gpt-layers", "1", "--gpt-dim", "32", "--gpt-heads", "2", "--seq-len", "32",
       "--batch-size", "4", "--log-every", "1"]


def losses(dtrain, args, folder, label):
    metrics = os.path.join(folder, label + ".jsonl")
    train(dtrain, args, metrics)
    return [r["loss"] for r in read_metrics(metrics) if "loss" in r and "step" in r and not r.get("final")]


def save(helper, path, *args):
    subprocess.run([helper, path] + [str(a) for a in args], check=True)


def main():
    helper, dtrain = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as folder:
        seed1 = os.path.join(folder, "mlp-seed1.safetensors")
        save(helper, seed1, 1, "seeded", "mlp", "32")

        # 1. The file's weights, not the seed's.
        reference = losses(dtrain, MLP + ["--strategy", "single", "--steps", "4", "--seed", "1"], folder, "seed1")
        loaded = losses(dtrain, MLP + ["--strategy", "ddp", "--nproc", "2", "--steps", "4", "--seed", "2",
                                       "--init-from", seed1], folder, "init")
        other = losses(dtrain, MLP + ["--strategy", "single", "--steps", "1", "--seed", "2"], folder, "seed2")
        print("check_init_from: --seed 1: %s\n  --seed 2 --init-from: %s\n  --seed 2: %s" % (reference, loaded, other))
        if len(loaded) != len(reference) or any(abs(a - b) > 1e-4 for a, b in zip(loaded, reference)):
            fail("--init-from a --seed 1 file did not reproduce the --seed 1 losses")
        if abs(other[0] - reference[0]) < 1e-3:
            fail("--seed 2 alone gives the --seed 1 loss: this check cannot tell whether the file was loaded")

        # 2. Zero weights: uniform predictions.
        zeros = os.path.join(folder, "mlp-zeros.safetensors")
        save(helper, zeros, 0, "zeros", "mlp", "32")
        first = losses(dtrain, MLP + ["--strategy", "single", "--steps", "1", "--init-from", zeros], folder, "mlp0")[0]
        if abs(first - math.log(10)) > 1e-5:
            fail("the MLP with zero weights starts at loss %.7f, not ln(10) = %.7f" % (first, math.log(10)))
        gpt_zeros = os.path.join(folder, "gpt-zeros.safetensors")
        save(helper, gpt_zeros, 0, "zeros", "gpt", 1, 32, 2, 32)
        first = losses(dtrain, GPT + ["--strategy", "fsdp", "--nproc", "2", "--steps", "1", "--init-from", gpt_zeros],
                       folder, "gpt0")[0]
        if abs(first - math.log(256)) > 1e-5:
            fail("the GPT with zero weights starts at loss %.7f, not ln(256) = %.7f" % (first, math.log(256)))

        # 4. Tensor parallelism: each rank reads its slices of the whole
        # model's file (--tp 2: FSDP over dp 2, and one replica over dp).
        gpt_seed1 = os.path.join(folder, "gpt-seed1.safetensors")
        save(helper, gpt_seed1, 1, "seeded", "gpt", 1, 32, 2, 32)
        gpt = GPT + ["--shuffle", "false", "--steps", "4"]
        reference = losses(dtrain, gpt + ["--strategy", "single", "--seed", "1"], folder, "gpt-seed1")
        for mesh in (["--strategy", "fsdp", "--nproc", "4", "--tp", "2"], ["--strategy", "ddp", "--nproc", "2", "--tp", "2"]):
            loaded = losses(dtrain, gpt + mesh + ["--seed", "2", "--init-from", gpt_seed1], folder, "gpt-tp")
            print("check_init_from: GPT --seed 1: %s\n  %s --seed 2 --init-from: %s" % (reference, " ".join(mesh), loaded))
            if len(loaded) != len(reference) or any(abs(a - b) > 1e-4 for a, b in zip(loaded, reference)):
                fail("%s --init-from a --seed 1 file did not reproduce the --seed 1 losses" % " ".join(mesh))

        # 5. Pipeline parallelism: each stage reads its blocks (and the tied
        # wte, on both end stages) of a 2-block GPT's file: FSDP over (dp, pp)
        # = (2, 2), and DDP on (1, 2, 2) with tensor parallelism inside.
        gpt2_seed1 = os.path.join(folder, "gpt2-seed1.safetensors")
        save(helper, gpt2_seed1, 1, "seeded", "gpt", 2, 32, 2, 32)
        gpt2 = list(GPT)
        gpt2[gpt2.index("--gpt-layers") + 1] = "2"
        gpt2 += ["--shuffle", "false", "--steps", "4"]
        reference = losses(dtrain, gpt2 + ["--strategy", "single", "--seed", "1"], folder, "gpt2-seed1")
        for mesh in (["--strategy", "fsdp", "--nproc", "4", "--pp", "2", "--microbatches", "2"],
                     ["--strategy", "ddp", "--nproc", "4", "--pp", "2", "--tp", "2", "--microbatches", "2"]):
            loaded = losses(dtrain, gpt2 + mesh + ["--seed", "2", "--init-from", gpt2_seed1], folder, "gpt-pp")
            print("check_init_from: 2-block GPT --seed 1: %s\n  %s --seed 2 --init-from: %s"
                  % (reference, " ".join(mesh), loaded))
            if len(loaded) != len(reference) or any(abs(a - b) > 1e-4 for a, b in zip(loaded, reference)):
                fail("%s --init-from a --seed 1 file did not reproduce the --seed 1 losses" % " ".join(mesh))

        # 3. Files that do not fit: exit 2 before any rank starts.
        text = os.path.join(folder, "notes.safetensors")
        with open(text, "w") as notes:
            notes.write("not tensors\n")
        for args, expect in [
                (MLP_ANY_WIDTH + ["--mlp-hidden", "64", "--init-from", seed1],
                 "--init-from: %s: tensor 'layers.1.weight' has shape [32, 784] in the file but [64, 784]" % seed1),
                (MLP_ANY_WIDTH + ["--mlp-hidden", "32,16", "--init-from", seed1],
                 "--init-from: %s does not fit the model: the model's 'layers.5.weight', 'layers.5.bias' are missing"
                 % seed1),
                (MLP + ["--init-from", text], "--init-from: %s: not a valid safetensors file" % text)]:
            result = subprocess.run([dtrain, "train", "--nproc", "2", "--steps", "1"] + args, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, timeout=120)
            output = result.stdout.decode()
            print(output.rstrip())
            if result.returncode != 2 or expect not in output or re.search(r"rank \d", output):
                fail("expected exit code 2 before any rank starts, with %r; got code %d" % (expect, result.returncode))
    print("check_init_from: OK")


if __name__ == "__main__":
    main()
