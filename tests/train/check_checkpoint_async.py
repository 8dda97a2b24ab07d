#!/usr/bin/env python3
"""End-to-end checks of checkpoints written in the background (dtrain train
--checkpoint-async; src/train/background_checkpoints.h). --log-every 1 is added
everywhere, so every step has a metrics line.

    check_checkpoint_async.py resume --every N --kill STEP:RANK DTRAIN -- TRAIN_ARGS...
        A reference run with blocking checkpoints every N steps; then the same
        run with --checkpoint-async, whose rank RANK kills itself (SIGKILL)
        after step STEP (DTRAIN_TEST_KILL_AT_STEP, src/train/restarts.h), while
        the writer thread may still be writing; then --resume, with
        --checkpoint-async again, must exit 0, resume from a complete checkpoint
        at or before STEP, and equal the reference bitwise (every step's loss
        after the resume, the final loss and eval_loss). The async checkpoint
        of step N lists the same files, sizes and xxHash64 as the blocking one
        of the reference (the same manifest), and no unfinished save is left.

    check_checkpoint_async.py kill-during-write --every N --slow STEP:MS --kill-rank R DTRAIN -- TRAIN_ARGS...
        Every rank's writer of the checkpoint of step STEP is held for MS ms
        after writing its file, before the agreement, the manifest and the
        rename (DTRAIN_TEST_SLOW_CHECKPOINT_WRITE,
        src/checkpoint/fault_injection.h, test-only); the first time rank R
        says it is held, this script SIGKILLs it, so the kill lands in the
        middle of the background write. With --max-restarts 1 the job must
        restart from the previous complete checkpoint (the launcher says
        which: the held one is not complete), exit 0, leave no unfinished
        save, and equal the reference bitwise.

    check_checkpoint_async.py plan DTRAIN -- TRAIN_ARGS...
        The staging buffer a --checkpoint-async run reports in its final line
        (checkpoint_staging_bytes, rank 0) is what `dtrain plan
        --checkpoint-async` with the run's model, strategy, ranks, batch and
        optimizer plans for rank 0 (peak.checkpoint_staging), to the byte.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_dtrain import TIMEOUT_S, fail, read_metrics, run, say  # noqa: E402


def losses(records):
    return {r["step"]: r["loss"] for r in records if "loss" in r and "final" not in r}


def final_record(records):
    finals = [r for r in records if r.get("final")]
    if not finals:
        fail("no final metrics line")
    return finals[-1]


def compare_with_reference(ref, records, first_step):
    ref_losses, got = losses(ref), losses(records)
    after = sorted(step for step in got if step > first_step)
    if not after:
        fail("no steps after step %d were logged" % first_step)
    for step in after:
        if got[step] != ref_losses[step]:
            fail("step %d: loss %r after the resume != uninterrupted %r (must be bitwise equal)"
                 % (step, got[step], ref_losses[step]))
    for key in ("steps", "loss", "eval_loss"):
        if final_record(records)[key] != final_record(ref)[key]:
            fail("final %s: %r != uninterrupted %r" % (key, final_record(records)[key], final_record(ref)[key]))
    say("steps %d-%d and the final loss %r equal the uninterrupted run bitwise"
        % (after[0], after[-1], final_record(records)["loss"]))


def files_of(checkpoint):
    with open(os.path.join(checkpoint, "manifest.json")) as f:
        manifest = json.load(f)
    return [(f["name"], f["bytes"], f["xxh64"]) for f in manifest["files"]]


def check_no_leftovers(folder):
    leftovers = [name for name in os.listdir(folder) if ".tmp" in name]
    if leftovers:
        fail("unfinished saves left in %s: %s" % (folder, leftovers))


def check_resume(options, dtrain, args, folder):
    every = ["--checkpoint-every", str(options.every), "--keep-last", "0"]
    sync_dir, async_dir = os.path.join(folder, "sync"), os.path.join(folder, "async")
    reference = os.path.join(folder, "reference.jsonl")
    run([dtrain, "train"] + args + every + ["--checkpoint-dir", sync_dir, "--metrics", reference])
    ref = read_metrics(reference)

    kill_step = int(options.kill.split(":")[0])
    code, output = run([dtrain, "train"] + args + every + ["--checkpoint-dir", async_dir, "--checkpoint-async"],
                       env={"DTRAIN_TEST_KILL_AT_STEP": options.kill}, expect_code=None)
    if code == 0:
        fail("the run whose rank was killed after step %d exited 0" % kill_step)
    if "in the background" not in output:
        fail("the async run never said it was writing a checkpoint in the background")

    metrics = os.path.join(folder, "resumed.jsonl")
    _, output = run([dtrain, "train"] + args + every + ["--checkpoint-dir", async_dir, "--checkpoint-async",
                                                        "--resume", "--metrics", metrics])
    records = read_metrics(metrics)
    resumed = final_record(records)["resumed_from_step"]
    if not 0 < resumed <= kill_step or resumed % options.every:
        fail("resumed from step %r; expected a checkpoint of a multiple of %d at or before the kill at step %d"
             % (resumed, options.every, kill_step))
    say("the killed async run left the checkpoint of step %d complete; resumed from it" % resumed)
    compare_with_reference(ref, records, resumed)

    name = "step-%08d" % options.every
    blocking, background = files_of(os.path.join(sync_dir, name)), files_of(os.path.join(async_dir, name))
    if blocking != background:
        fail("%s: the async checkpoint's files %s differ from the blocking one's %s" % (name, background, blocking))
    say("%s written in the background has the blocking save's files, sizes and xxHash64" % name)
    check_no_leftovers(async_dir)


def run_killing_held_writer(command, env, kill_rank, slow_step):
    """Runs `command`; the first time rank `kill_rank` says its writer holds the
    checkpoint of `slow_step`, SIGKILLs that process. Returns (exit code, output)."""
    say("running: %s%s" % ("".join("%s=%s " % item for item in env.items()), " ".join(command)))
    start, killed, lines = time.time(), False, []
    held = re.compile(r"DTRAIN_TEST_SLOW_CHECKPOINT_WRITE=\S+: rank %d \(pid (\d+)\) holds the write of step %d "
                      % (kill_rank, slow_step))
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           env=dict(os.environ, **env))
    for raw in job.stdout:
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        print(line, flush=True)
        lines.append(line)
        match = held.search(line)
        if match and not killed:
            say("killing rank %d (pid %s) while its writer holds the checkpoint of step %d"
                % (kill_rank, match.group(1), slow_step))
            os.kill(int(match.group(1)), signal.SIGKILL)
            killed = True
        if time.time() - start > TIMEOUT_S:
            job.kill()
            fail("still running after %d s" % TIMEOUT_S)
    if not killed:
        fail("rank %d never said its writer held the checkpoint of step %d" % (kill_rank, slow_step))
    return job.wait(), "\n".join(lines)


def check_kill_during_write(options, dtrain, args, folder):
    every = ["--checkpoint-every", str(options.every)]
    reference = os.path.join(folder, "reference.jsonl")
    run([dtrain, "train"] + args + ["--metrics", reference])
    ref = read_metrics(reference)

    slow_step = int(options.slow.split(":")[0])
    previous = slow_step - options.every
    checkpoints = os.path.join(folder, "checkpoints")
    metrics = os.path.join(folder, "restarted.jsonl")
    code, output = run_killing_held_writer(
        [dtrain, "train"] + args + every + ["--checkpoint-dir", checkpoints, "--checkpoint-async", "--max-restarts",
                                            "1", "--metrics", metrics],
        {"DTRAIN_TEST_SLOW_CHECKPOINT_WRITE": options.slow}, options.kill_rank, slow_step)
    if code != 0:
        fail("the job exited with %d, expected 0 after one restart" % code)
    restarts = re.findall(r"^dtrain launch: restart .*$", output, re.M)
    if len(restarts) != 1:
        fail("expected one restart, the launcher logged %d" % len(restarts))
    if "restarting from the checkpoint of step %d " % previous not in restarts[0]:
        fail("the restart did not take the previous complete checkpoint (step %d): %s" % (previous, restarts[0]))
    say("killed while the checkpoint of step %d was being written: restarted from step %d" % (slow_step, previous))
    records = read_metrics(metrics)
    if final_record(records)["restarts"] != 1:
        fail("final line: restarts %r, expected 1" % final_record(records)["restarts"])
    compare_with_reference(ref, records, previous)
    check_no_leftovers(checkpoints)


# The `dtrain train` flags `dtrain plan` takes too (each with a value).
PLAN_FLAGS = {"--model", "--mlp-hidden", "--gpt-layers", "--gpt-dim", "--gpt-heads", "--seq-len", "--strategy",
              "--nproc", "--batch-size", "--optimizer"}


def check_plan(options, dtrain, args, folder):
    metrics = os.path.join(folder, "run.jsonl")
    run([dtrain, "train"] + args + ["--checkpoint-dir", os.path.join(folder, "checkpoints"), "--checkpoint-every", "5",
                                    "--checkpoint-async", "--metrics", metrics])
    measured = final_record(read_metrics(metrics)).get("checkpoint_staging_bytes")
    chosen = {}  # the last value of each, as dtrain train takes it
    for flag, value in zip(args, args[1:]):
        if flag in PLAN_FLAGS:
            chosen[flag] = value
    plan_args = [word for item in chosen.items() for word in item]
    _, output = run([dtrain, "plan"] + plan_args + ["--checkpoint-async", "--json"])
    planned = json.loads(output)["peak"]["checkpoint_staging"]
    if measured != planned:
        fail("the staging buffer holds %r bytes on rank 0; dtrain plan says %r" % (measured, planned))
    say("staging buffer: %d bytes on rank 0, as dtrain plan --checkpoint-async says" % measured)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", choices=["resume", "kill-during-write", "plan"])
    parser.add_argument("--every", type=int, default=10, help="--checkpoint-every")
    parser.add_argument("--kill", default="25:1", help="resume: STEP:RANK (DTRAIN_TEST_KILL_AT_STEP)")
    parser.add_argument("--kill-rank", type=int, default=1, help="kill-during-write: the rank killed")
    parser.add_argument("--slow", default="20:3000", help="STEP:MS (DTRAIN_TEST_SLOW_CHECKPOINT_WRITE)")
    parser.add_argument("dtrain")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- TRAIN_ARGS...")
    options = parser.parse_args()
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    with tempfile.TemporaryDirectory(prefix="dtrain-ckpt-async-") as folder:
        check = {"resume": check_resume, "kill-during-write": check_kill_during_write, "plan": check_plan}[options.check]
        check(options, options.dtrain, args + ["--log-every", "1"], folder)


if __name__ == "__main__":
    main()
