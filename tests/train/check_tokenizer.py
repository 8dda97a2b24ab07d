#!/usr/bin/env python3
"""dtrain tokenize and --tokenizer (issue 22): a subword tokenizer trained on a
corpus, the corpus encoded, a Llama trained on the ids under FSDP, and its
samples decoded.

    check_tokenizer.py DTRAIN

1. `dtrain tokenize --vocab-size 2000` on the fortunes writes PREFIX.model,
   PREFIX.vocab and PREFIX.bin (llm.c's header: magic 20240520, the count of
   the ids that follow); the ids are below the vocabulary and fewer than the
   corpus's bytes (subwords).
2. `dtrain train --model llama --data tokens:PREFIX.bin --tokenizer
   PREFIX.model --strategy fsdp --nproc 2` (vocabulary from the tokenizer)
   exits 0, its loss falls more than 1 nat below a uniform guess's
   (ln 2000), and it prints samples decoded to text that start with the
   prompt.
3. Refusals, exit code 2 with the problem named: --tokenizer with text data,
   a tokenizer of more pieces than --vocab-size, a missing model file.
"""

import json
import math
import os
import struct
import subprocess
import sys
import tempfile

VOCAB = 2000


def fail(message):
    print("check_tokenizer: FAILED: " + message, flush=True)
    sys.exit(1)


def run(command, expect=0):
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != expect:
        fail("%s: exit code %d, expected %d\n%s" % (" ".join(command), result.returncode, expect,
                                                   result.stdout[-3000:] + result.stderr[-3000:]))
    return result


def main():
    dtrain = sys.argv[1]
    with tempfile.TemporaryDirectory() as folder:
        prefix = os.path.join(folder, "fortunes")
        run([dtrain, "tokenize", "--vocab-size", str(VOCAB), "--output", prefix])
        for suffix in (".model", ".vocab", ".bin"):
            if not os.path.isfile(prefix + suffix):
                fail("dtrain tokenize wrote no " + prefix + suffix)
        with open(prefix + ".bin", "rb") as f:
            header = struct.unpack("<256i", f.read(1024))
            ids = f.read()
        if header[0] != 20240520 or header[2] * 2 != len(ids):
            fail("%s.bin: header %s does not describe %d bytes of uint16 ids" % (prefix, header[:3], len(ids)))
        values = struct.unpack("<%dH" % (len(ids) // 2), ids)
        if max(values) >= VOCAB:
            fail("an id %d is not below the vocabulary of %d" % (max(values), VOCAB))
        print("check_tokenizer: %d ids for the fortunes, the largest %d" % (len(values), max(values)), flush=True)

        metrics = os.path.join(folder, "run.jsonl")
        result = run([dtrain, "train", "--model", "llama", "--gpt-layers", "2", "--gpt-dim", "64", "--gpt-heads", "4",
                      "--kv-heads", "2", "--seq-len", "64", "--data", "tokens:" + prefix + ".bin", "--tokenizer",
                      prefix + ".model", "--strategy", "fsdp", "--nproc", "2", "--steps", "80", "--batch-size", "16",
                      "--lr", "3e-3", "--eval-windows", "32", "--samples", "2", "--metrics", metrics])
        records = [json.loads(line) for line in open(metrics)]
        final = records[-1]
        if not (final["eval_loss"] < math.log(VOCAB) - 1.0):
            fail("the validation loss %.3f did not fall 1 nat below a uniform guess's %.3f" %
                 (final["eval_loss"], math.log(VOCAB)))
        lines = result.stdout.splitlines()
        sample_lines = [lines[i + 1] for i, line in enumerate(lines[:-1]) if line.startswith("sample ")]
        if len(sample_lines) != 2 or not all(line.startswith("  | The ") for line in sample_lines):
            fail("expected 2 samples starting with the prompt 'The ', got:\n" + result.stdout[-2000:])
        print("check_tokenizer: validation loss %.3f (uniform %.3f); a sample: %s" %
              (final["eval_loss"], math.log(VOCAB), sample_lines[0][:100]), flush=True)

        refusals = [
            (["--data", "text:/usr/share/games/fortunes", "--tokenizer", prefix + ".model"], "needs --data tokens:PATH"),
            (["--data", "tokens:" + prefix + ".bin", "--tokenizer", prefix + ".model", "--vocab-size", "500"],
             "more than --vocab-size 500"),
            (["--data", "tokens:" + prefix + ".bin", "--tokenizer", os.path.join(folder, "missing.model")],
             "missing.model"),
        ]
        for flags, words in refusals:
            refused = run([dtrain, "train", "--model", "llama", "--steps", "1", "--nproc", "1", "--strategy", "single"]
                          + flags, expect=2)
            if words not in refused.stderr:
                fail("the refusal %r does not say %r" % (refused.stderr.strip(), words))
            print("check_tokenizer: refused: " + refused.stderr.strip().splitlines()[-1], flush=True)
    print("check_tokenizer: OK")


if __name__ == "__main__":
    main()
