#!/usr/bin/env python3
"""dtrain train --data tokens:PATH (issue 22): token files in nanoGPT's and
llm.c's layouts train the GPT with a vocabulary of their own.

Writes one stream of token ids (a vocabulary of 1000, each id mostly followed
by a fixed successor, so that there is something to learn) in every layout:
nanoGPT's flat uint16 and uint32 arrays, llm.c's header-prefixed uint16 and
uint32 files, and a folder with train.bin and val.bin split where a single
file splits. Checks:
- every layout gives the same run: every step's loss and the validation loss
  equal the flat uint16 file's bitwise (the same ids, the same windows);
- the loss falls: the last step's is more than 0.5 nat below ln(1000), a
  uniform guess's (the first step's is about that);
- FSDP on 2 ranks equals the single process within 1e-5 on the token file;
- bad files and flags fail with a message naming the problem, exit code 1 or
  2 (no crash): a byte count that is not a whole number of ids, an llm.c
  header cut short, a header counting other than the ids that follow, ids
  outside --vocab-size, a folder without its train and validation files,
  --samples with token ids.

    check_tokens.py DTRAIN
"""

import json
import math
import os
import random
import struct
import subprocess
import sys
import tempfile

VOCAB = 1000
TOKENS = 60000
ARGS = ["--model", "gpt", "--gpt-layers", "2", "--gpt-dim", "64", "--gpt-heads", "4", "--seq-len", "32",
        "--batch-size", "8", "--steps", "40", "--lr", "3e-3", "--eval-windows", "16", "--vocab-size", str(VOCAB),
        "--log-every", "1"]


def fail(message):
    print("check_tokens: FAILED: " + message, flush=True)
    sys.exit(1)


def say(message):
    print("check_tokens: " + message, flush=True)


def stream():
    rng = random.Random(5)
    successor = list(range(VOCAB))
    rng.shuffle(successor)
    ids, current = [], 0
    for _ in range(TOKENS):
        ids.append(current)
        current = successor[current] if rng.random() < 0.9 else rng.randrange(VOCAB)
    return ids


def flat(ids, code):
    return struct.pack("<%d%s" % (len(ids), code), *ids)


def llmc(ids, wide):
    header = [20240801 if wide else 20240520, 7 if wide else 1, len(ids)] + [0] * 253
    return struct.pack("<256i", *header) + flat(ids, "I" if wide else "H")


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)
    return path


def train(dtrain, folder, name, data_args, extra=()):
    metrics = os.path.join(folder, name + ".jsonl")
    command = [dtrain, "train"] + ARGS + data_args + ["--metrics", metrics] + list(extra)
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        fail("%s: exit code %d\n%s" % (" ".join(command), result.returncode, result.stdout[-2000:] + result.stderr[-2000:]))
    with open(metrics) as f:
        records = [json.loads(line) for line in f]
    losses = [r["loss"] for r in records if "loss" in r and "step" in r and not r.get("final")]
    return losses, records[-1]["eval_loss"], result.stdout


def rejects(dtrain, what, data_args, expect, extra=()):
    command = [dtrain, "train"] + ARGS + data_args + list(extra)
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    if result.returncode not in (1, 2):
        fail("%s: exit code %d, expected 1 or 2 with a message\n%s" % (what, result.returncode, output[-2000:]))
    if expect not in output:
        fail("%s: the message does not say '%s':\n%s" % (what, expect, output[-2000:]))
    say("%s: refused (exit %d): ...%s..." % (what, result.returncode, expect))


def main():
    dtrain = sys.argv[1]
    ids = stream()
    with tempfile.TemporaryDirectory() as folder:
        files = {
            "nanoGPT uint16": (write(os.path.join(folder, "flat16.bin"), flat(ids, "H")), []),
            "nanoGPT uint32": (write(os.path.join(folder, "flat32.bin"), flat(ids, "I")), ["--token-dtype", "uint32"]),
            "llm.c uint16": (write(os.path.join(folder, "llmc16.bin"), llmc(ids, False)), []),
            "llm.c uint32": (write(os.path.join(folder, "llmc32.bin"), llmc(ids, True)), []),
        }
        split = os.path.join(folder, "split")
        os.mkdir(split)
        validation = int(len(ids) * 0.1)  # the single file's split: its last floor(n / 10) ids
        write(os.path.join(split, "shakespeare_train.bin"), llmc(ids[:len(ids) - validation], False))
        write(os.path.join(split, "shakespeare_val.bin"), llmc(ids[len(ids) - validation:], False))
        files["a folder of llm.c files"] = (split, [])

        reference, reference_eval, output = train(dtrain, folder, "flat16", ["--data", "tokens:" + files["nanoGPT uint16"][0]])
        if "nanoGPT uint16" not in output:
            fail("the banner does not name the layout:\n" + output[:1500])
        say("nanoGPT uint16: %d steps, loss %.4f -> %.4f, validation %.4f" % (len(reference), reference[0],
                                                                            reference[-1], reference_eval))
        if not reference[-1] < math.log(VOCAB) - 0.5:
            fail("the loss did not fall 0.5 nat below a uniform guess's %.4f: %.4f -> %.4f" % (
                math.log(VOCAB), reference[0], reference[-1]))
        for layout, (path, extra) in files.items():
            if layout == "nanoGPT uint16":
                continue
            losses, eval_loss, _ = train(dtrain, folder, layout.replace(" ", "_").replace(".", ""),
                                         ["--data", "tokens:" + path] + extra)
            if losses != reference or eval_loss != reference_eval:
                fail("%s: the run differs from the flat uint16 file's (last loss %.6f vs %.6f, validation %.6f vs %.6f)"
                     % (layout, losses[-1], reference[-1], eval_loss, reference_eval))
            say("%s: the same run, bitwise" % layout)
        losses, eval_loss, _ = train(dtrain, folder, "fsdp2", ["--data", "tokens:" + files["llm.c uint16"][0]],
                                     ["--strategy", "fsdp", "--nproc", "2"])
        worst = max(abs(a - b) for a, b in zip(losses, reference))
        if len(losses) != len(reference) or worst > 1e-5 or abs(eval_loss - reference_eval) > 1e-5:
            fail("fsdp on 2 ranks differs from one process by %.3g (validation %.6f vs %.6f)" % (worst, eval_loss,
                                                                                           reference_eval))
        say("fsdp on 2 ranks: every step within %.3g of one process" % worst)

        odd = write(os.path.join(folder, "odd.bin"), flat(ids[:1001], "H") + b"\0")
        rejects(dtrain, "an odd byte count", ["--data", "tokens:" + odd], "not a whole number of uint16 ids")
        short = write(os.path.join(folder, "short.bin"), llmc(ids, False)[:600])
        rejects(dtrain, "a header cut short", ["--data", "tokens:" + short], "fewer than its 1024-byte header")
        cut = write(os.path.join(folder, "cut.bin"), llmc(ids, False)[:-10])
        rejects(dtrain, "a header counting more ids", ["--data", "tokens:" + cut], "the header counts 60000 tokens")
        rejects(dtrain, "ids outside the vocabulary", ["--data", "tokens:" + files["llm.c uint16"][0]],
                "outside the model's vocabulary of 500: pass --vocab-size 1000", ["--vocab-size", "500"])
        empty = os.path.join(folder, "empty")
        os.mkdir(empty)
        rejects(dtrain, "a folder without its files", ["--data", "tokens:" + empty], "it needs exactly one of each")
        rejects(dtrain, "--samples with token ids", ["--data", "tokens:" + files["llm.c uint16"][0]],
                "--samples 2 decodes bytes", ["--samples", "2"])
    say("passed")


if __name__ == "__main__":
    main()
