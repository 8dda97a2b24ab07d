#!/usr/bin/env python3
"""The end of a run, as the H200 run of 2026-12-04 exercised it (issue 36).

check_end_of_run.py DTRAIN -- TRAIN_ARGS...

1. `--samples 0` means no sampling: the run ends with its final metrics line
   and prints no sample. (It used to run the model on a [0, T] batch, which
   CUDA refused; Model::forward now refuses it on CPU too, Note [no empty
   batches], so this fails wherever the trainer makes such a call.)
2. A resumed run ends the same way, and its first pruning of an old
   checkpoint removes the folder whole and leaves nothing aside (every
   resumed run died of SIGSEGV there on the GPU machine: Note [filesystem
   symbols from LibTorch]).
"""
import os
import shutil
import sys
import tempfile

from run_dtrain import fail, read_metrics, run, say

separator = sys.argv.index("--")
dtrain = sys.argv[1]
train_args = sys.argv[separator + 1:]
work = tempfile.mkdtemp(prefix="dtrain-end-of-run-")
try:
    checkpoints = os.path.join(work, "ck")

    def train(steps, metrics, *extra):
        _, output = run([dtrain, "train", *train_args, "--steps", str(steps), "--samples", "0",
                         "--checkpoint-dir", checkpoints, "--checkpoint-every", "2", "--keep-last", "2",
                         "--metrics", metrics, *extra])
        records = read_metrics(metrics)
        if not records[-1].get("final"):
            fail("%s's last line is not the final one: %s" % (metrics, records[-1]))
        if "sample 1:" in output:
            fail("--samples 0 printed a sample")
        if "eval_loss" not in records[-1]:
            fail("the final line has no eval_loss: the final evaluation did not run")
        return records

    train(4, os.path.join(work, "first.jsonl"))
    final = train(6, os.path.join(work, "resumed.jsonl"), "--resume")[-1]
    if final.get("steps") != 6:
        fail("the resumed run ended at step %s, not 6" % final.get("steps"))
    left = sorted(os.listdir(checkpoints))
    if left != ["step-00000004", "step-00000006"]:
        fail("--keep-last 2 after steps 2, 4 and 6 should leave step-00000004 and step-00000006, not %s" % left)
    say("PASS: both runs ended with their final line, no samples; the resumed run pruned step 2 whole")
finally:
    shutil.rmtree(work, ignore_errors=True)
