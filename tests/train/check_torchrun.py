#!/usr/bin/env python3
"""torchrun's own restarts (issue 19, item 5): `torchrun --max-restarts 1
--no-python dtrain train ...` with a rank killed once (DTRAIN_TEST_KILL_AT_STEP,
src/train/restarts.h) restarts every worker with TORCHELASTIC_RESTART_COUNT=1,
and dtrain train then resumes from the newest checkpoint by itself: the job
exits 0, its final line says restarts 1, and every step's loss (the redone
ones too) and the final loss equal an uninterrupted `dtrain train --nproc 2
--backend c10d` bitwise.

    check_torchrun.py TORCHRUN DTRAIN -- TRAIN_ARGS...

Exits 77 (skipped) when TORCHRUN is not there: scripts/setup installs it
with the pinned torch wheel, but a LibTorch-only build has none.
"""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_dtrain import fail, read_metrics, run, say  # noqa: E402

KILL = "25:1:0"  # rank 1 dies after step 25 on the first attempt only
EVERY = 10


def main():
    split = sys.argv.index("--")
    torchrun, dtrain = sys.argv[1], sys.argv[2]
    args = sys.argv[split + 1:] + ["--log-every", "1"]
    if not os.access(torchrun, os.X_OK):
        say("SKIPPED: no torchrun at %s (the torch wheel of scripts/setup)" % torchrun)
        sys.exit(77)
    folder = tempfile.mkdtemp(prefix="dtrain-torchrun-")
    reference = os.path.join(folder, "reference.jsonl")
    run([dtrain, "train", "--nproc", "2", "--backend", "c10d"] + args + ["--metrics", reference])

    # Our launcher's variables must not leak in: the count comes from torchrun.
    os.environ.pop("DTRAIN_RESTART_COUNT", None)
    os.environ["DTRAIN_TEST_KILL_AT_STEP"] = KILL
    metrics = os.path.join(folder, "torchrun.jsonl")
    _, output = run([torchrun, "--standalone", "--nnodes", "1:1", "--nproc-per-node", "2", "--max-restarts", "1",
                     "--no-python", dtrain, "train"] + args +
                    ["--checkpoint-dir", os.path.join(folder, "checkpoints"), "--checkpoint-every", str(EVERY),
                     "--metrics", metrics])
    if "kills itself after step 25" not in output:
        fail("rank 1 was not killed (DTRAIN_TEST_KILL_AT_STEP=%s)" % KILL)
    if "resuming from step %d" % (25 // EVERY * EVERY) not in output:
        fail("the restarted workers did not say 'resuming from step %d'" % (25 // EVERY * EVERY))

    ref = read_metrics(reference)
    ref_losses = {r["step"]: r["loss"] for r in ref if "loss" in r and not r.get("final")}
    got = read_metrics(metrics)
    for r in got:
        if "loss" in r and not r.get("final") and r["loss"] != ref_losses[r["step"]]:
            fail("step %d: loss %r under torchrun's restart != uninterrupted %r" % (r["step"], r["loss"],
                                                                                  ref_losses[r["step"]]))
    final, ref_final = got[-1], ref[-1]
    if not final.get("final") or final.get("restarts") != 1:
        fail("the final line %s does not say restarts 1" % final)
    for key in ("steps", "loss", "eval_loss"):
        if final.get(key) != ref_final.get(key):
            fail("final %s: %r after torchrun's restart != uninterrupted %r" % (key, final.get(key), ref_final.get(key)))
    say("torchrun restarted the job once; it resumed and ended at loss %r, bitwise the uninterrupted run's"
        % final["loss"])


if __name__ == "__main__":
    main()
