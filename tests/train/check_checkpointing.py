#!/usr/bin/env python3
"""End-to-end checks of checkpointing and failure handling in `dtrain train`.

Each check runs DTRAIN train TRAIN_ARGS with its own flags added, in a fresh
temporary folder, and compares per-step losses through the metrics files
(--log-every 1 is added everywhere, so every step has a line).

    check_checkpointing.py kill-resume DTRAIN -- TRAIN_ARGS...
        A reference run; then the same run with --checkpoint-dir and
        --checkpoint-every 10, whose rank 1 gets SIGKILL once the step-20
        checkpoint exists. The job must exit non-zero within 60 s naming
        rank 1; then --resume continues from the newest checkpoint and every
        later step's loss, and the final evaluation, equal the reference
        bitwise.

    check_checkpointing.py signal DTRAIN -- TRAIN_ARGS...
        SIGTERM to the job once step 10 is logged: it saves a checkpoint at
        the next step boundary and exits with 143 (128 + SIGTERM); --resume
        then finishes the run with the reference's losses, bitwise.

    check_checkpointing.py nonfinite DTRAIN -- TRAIN_ARGS...
        A NaN loss at step 5 (--debug-nan-at-step): the default stops with
        an error naming step 5 and writes no checkpoint after it;
        --on-nonfinite skip finishes with one skipped step, the weights
        unchanged by it (step 5's next batch loss is finite).

    check_checkpointing.py damaged DTRAIN -- TRAIN_ARGS...
        A run with checkpoints at steps 10, 20 and 30; one byte of a shard of
        step 30 flipped: --resume passes over step 30 naming the file and
        the checksum, and continues from step 20 with the first run's losses,
        bitwise. With every checkpoint damaged, --resume stops with an error
        saying so instead of quietly starting at step 0. Resuming with another
        --seed and --steps names both differences.

    check_checkpointing.py reshard --from "ARGS" --to "ARGS" DTRAIN -- TRAIN_ARGS...
        A run with the --from strategy flags and checkpoints every 10 steps;
        every checkpoint after step 10 removed; then --resume with the --to
        flags (another strategy or world size). It must say it resumes from
        step 10 saved by the --from strategy, and every later step's loss and
        the final evaluation must equal an uninterrupted --to run's within
        --tolerance (the strategies' arithmetic differs in rounding only).

    check_checkpointing.py disk-full DTRAIN -- TRAIN_ARGS...
        A disk that holds one checkpoint but not two: the second save fails
        with a message naming the step and the cause, the first checkpoint
        stays complete, and no partial directory is left behind. Always on a
        simulated full disk (DTRAIN_FAULT_DISK_BYTES makes the writers fail
        with ENOSPC); with root, also on a small tmpfs.
"""

import argparse
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_dtrain import fail, read_metrics, run, say  # noqa: E402

def step_losses(records):
    return {r["step"]: r["loss"] for r in records if "loss" in r and "final" not in r}


def final_record(records):
    finals = [r for r in records if r.get("final")]
    return finals[-1] if finals else None


def descendants(pid):
    """Every process below `pid`, from /proc (children files list direct children)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for children_file in glob.glob("/proc/%d/task/*/children" % parent):
            try:
                with open(children_file) as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            found.extend(children)
            todo.extend(children)
    return found


def rank_of(pid):
    """The rank a process of the job is (from its environment), or None."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return None
    if b"train" not in argv or b"--supervise-rank" in argv:
        return None
    for name in (b"OMPI_COMM_WORLD_RANK", b"RANK"):
        if name in env:
            return int(env[name])
    return None


def wait_for(condition, seconds, what, process=None):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if condition():
            return
        if process is not None and process.poll() is not None:
            fail("the job ended (code %s) before %s" % (process.returncode, what))
        time.sleep(0.05)
    if process is not None and process.stdout is not None:
        # What the job had done by then (its step lines), to tell a slow run from a stuck one.
        process.kill()
        output = process.communicate()[0].decode("utf-8", errors="replace").splitlines()
        print("\n".join(output[-15:]), flush=True)
    fail("waited %d s for %s" % (seconds, what))


def complete_checkpoint(folder, step):
    return os.path.isfile(os.path.join(folder, "step-%08d" % step, "manifest.json"))


def newest_complete_checkpoint(folder):
    """The newest step with a complete checkpoint in `folder` (its manifest is written last), or 0."""
    names = [os.path.basename(os.path.dirname(m)) for m in glob.glob(os.path.join(folder, "step-*", "manifest.json"))]
    return max((int(name[5:]) for name in names if name[5:].isdigit()), default=0)


def compare_after(reference, resumed, first_step):
    """Every step after first_step, and the final evaluation, equal bitwise."""
    ref, res = step_losses(reference), step_losses(resumed)
    later = sorted(s for s in ref if s > first_step)
    if not later:
        fail("the run resumed at step %d, past the reference's last step" % first_step)
    for step in later:
        if step not in res:
            fail("the resumed run has no loss for step %d" % step)
        if res[step] != ref[step]:
            fail("step %d: resumed loss %r != uninterrupted %r (must be bitwise equal)" % (step, res[step], ref[step]))
    ref_final, res_final = final_record(reference), final_record(resumed)
    if res_final is None or res_final["eval_loss"] != ref_final["eval_loss"]:
        fail("final evaluation differs: %s vs %s" % (res_final, ref_final))
    say("steps %d..%d after resuming at %d equal the uninterrupted run bitwise; eval_loss %r"
        % (later[0], later[-1], first_step, ref_final["eval_loss"]))


def reference_run(dtrain, args, folder):
    path = os.path.join(folder, "reference.jsonl")
    run([dtrain, "train"] + args + ["--metrics", path])
    return read_metrics(path)


# --saving: flags only the runs that write checkpoints get (--checkpoint-async
# needs --checkpoint-dir, which the reference run has not).
SAVING = []


def resume_run(dtrain, args, checkpoints, folder, expect_step):
    path = os.path.join(folder, "resumed.jsonl")
    _, output = run([dtrain, "train"] + args + SAVING + ["--checkpoint-dir", checkpoints, "--resume", "--metrics", path])
    if "resuming from step %d " % expect_step not in output:
        fail("expected 'resuming from step %d' in the output" % expect_step)
    return read_metrics(path)


def check_kill_resume(dtrain, args, folder):
    reference = reference_run(dtrain, args, folder)
    checkpoints = os.path.join(folder, "checkpoints")
    metrics = os.path.join(folder, "killed.jsonl")
    # Rank 1 is slowed 20x (it sleeps 19 times its compute time each step; rank 0 waits for it in the
    # all-reduce), so the kill lands mid-run: unslowed, the small MLP's 400 steps take under a second and
    # the run could finish, or prune step 20's checkpoint, between two polls. Slowing leaves the numbers alone.
    # (At 100x, rank 1's per-step CPU time, spin-waits included, grew from step to step on this 2-core
    # machine, 4.5 s to 9 s a step by step 5, and step 20 came after 60 s in one run and 120+ in another.)
    command = [dtrain, "train"] + args + ["--checkpoint-dir", checkpoints, "--checkpoint-every", "10",
                                          "--slow-rank", "1:20", "--metrics", metrics]
    say("running: " + " ".join(shlex.quote(a) for a in command))
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    # Rank 1's delay is 19 x its thread's CPU time per step, which varies with the machine's load: a
    # generous bound.
    wait_for(lambda: newest_complete_checkpoint(checkpoints) >= 20, 240, "a checkpoint of step 20 or later", job)
    victims = [pid for pid in descendants(job.pid) if rank_of(pid) == 1]
    if not victims:
        job.kill()
        fail("found no process of rank 1 under pid %d" % job.pid)
    os.kill(victims[-1], signal.SIGKILL)
    killed_at = time.time()
    say("SIGKILL to rank 1 (pid %d)" % victims[-1])
    try:
        output, _ = job.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        job.kill()
        fail("the job was still running 90 s after rank 1 was killed")
    took = time.time() - killed_at
    text = output.decode("utf-8", errors="replace")
    print(text.rstrip("\n"), flush=True)
    if job.returncode == 0:
        fail("the job exited 0 after rank 1 was killed")
    if took > 60:
        fail("the job took %.1f s to stop after rank 1 was killed (at most 60)" % took)
    if "rank 1" not in text:
        fail("the job's output does not name rank 1")
    say("the job exited with %d, %.1f s after rank 1 was killed, naming rank 1" % (job.returncode, took))
    steps = sorted(int(os.path.basename(p)[5:]) for p in glob.glob(os.path.join(checkpoints, "step-*"))
                   if os.path.basename(p)[5:].isdigit())
    if not steps:
        fail("no complete checkpoint left")
    compare_after(reference, resume_run(dtrain, args, checkpoints, folder, steps[-1]), steps[-1])


def check_signal(dtrain, args, folder):
    reference = reference_run(dtrain, args, folder)
    checkpoints = os.path.join(folder, "checkpoints")
    metrics = os.path.join(folder, "stopped.jsonl")
    # Slowed as in check_kill_resume, so the signal arrives before the run's last step.
    command = [dtrain, "train"] + args + SAVING + ["--checkpoint-dir", checkpoints, "--slow-rank", "1:100",
                                                  "--metrics", metrics]
    say("running: " + " ".join(shlex.quote(a) for a in command))
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def logged_step_10():
        # The file is read while the run writes it: it may not exist yet, be empty, or end mid-line.
        try:
            with open(metrics) as f:
                records = [json.loads(line) for line in f if line.endswith("\n")]
        except (OSError, ValueError):
            return False
        return max(step_losses(records), default=0) >= 10

    wait_for(logged_step_10, 120, "step 10 in the metrics file", job)
    job.send_signal(signal.SIGTERM)
    sent = time.time()
    try:
        output, _ = job.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        job.kill()
        fail("the job was still running 60 s after SIGTERM")
    text = output.decode("utf-8", errors="replace")
    print(text.rstrip("\n"), flush=True)
    if job.returncode != 128 + signal.SIGTERM:
        fail("exit code %d after SIGTERM, expected %d" % (job.returncode, 128 + signal.SIGTERM))
    final = final_record(read_metrics(metrics))
    if final is None or final.get("stopped_by") != "SIGTERM":
        fail("the final metrics line does not say stopped_by SIGTERM: %s" % final)
    stopped_at = final["steps"]
    if not complete_checkpoint(checkpoints, stopped_at):
        fail("no complete checkpoint of step %d, where the run stopped" % stopped_at)
    say("SIGTERM: stopped after step %d with a checkpoint, %.1f s after the signal" % (stopped_at, time.time() - sent))
    compare_after(reference, resume_run(dtrain, args, checkpoints, folder, stopped_at), stopped_at)


def check_nonfinite(dtrain, args, folder):
    checkpoints = os.path.join(folder, "checkpoints")
    metrics = os.path.join(folder, "stop.jsonl")
    code, output = run([dtrain, "train"] + args + ["--debug-nan-at-step", "5", "--checkpoint-dir", checkpoints,
                                                   "--checkpoint-every", "2", "--metrics", metrics], expect_code=None)
    if code == 0 or "the loss is nan at step 5" not in output:
        fail("a NaN loss at step 5 must stop the run with an error naming step 5")
    saved = sorted(os.path.basename(p) for p in glob.glob(os.path.join(checkpoints, "step-*")))
    if saved[-1:] != ["step-00000004"]:
        fail("after a NaN at step 5 the newest checkpoint must be step 4's, found %s" % saved)
    say("--on-nonfinite stop: exit %d naming step 5; newest checkpoint step 4" % code)

    metrics = os.path.join(folder, "skip.jsonl")
    run([dtrain, "train"] + args + ["--debug-nan-at-step", "5", "--on-nonfinite", "skip", "--metrics", metrics])
    records = read_metrics(metrics)
    losses = step_losses(records)
    final = final_record(records)
    if final["skipped_steps"] != 1:
        fail("expected skipped_steps 1 in the final line: %s" % final)
    if losses.get(5) is not None:
        fail("step 5's loss should be NaN (written as null), got %r" % losses.get(5))
    later = [losses[s] for s in losses if s > 5]
    if not later or any(v is None for v in later) or final["eval_loss"] is None:
        fail("the steps after the skipped one must have finite losses: %s" % later)
    say("--on-nonfinite skip: step 5 skipped, %d later steps finite, eval_loss %r" % (len(later), final["eval_loss"]))


def check_reshard(dtrain, args, folder, source, target, tolerance):
    reference = reference_run(dtrain, args + target, folder)
    checkpoints = os.path.join(folder, "checkpoints")
    run([dtrain, "train"] + args + source + ["--checkpoint-dir", checkpoints, "--checkpoint-every", "10",
                                             "--keep-last", "0"])
    for path in glob.glob(os.path.join(checkpoints, "step-*")):
        if os.path.basename(path) != "step-00000010":
            shutil.rmtree(path)
    resumed = resume_run(dtrain, args + target, checkpoints, folder, 10)
    saved_by = json.load(open(os.path.join(checkpoints, "step-00000010", "manifest.json")))["strategy"]
    wanted = source[source.index("--strategy") + 1]
    if saved_by != wanted:
        fail("the checkpoint says it was saved by %r, not %r" % (saved_by, wanted))
    ref, res = step_losses(reference), step_losses(resumed)
    later = sorted(s for s in ref if s > 10)
    worst = 0.0
    for step in later:
        if res.get(step) is None or ref[step] is None:
            fail("step %d: no finite loss (resumed %r, uninterrupted %r)" % (step, res.get(step), ref[step]))
        worst = max(worst, abs(res[step] - ref[step]))
    ref_eval, res_eval = final_record(reference)["eval_loss"], final_record(resumed)["eval_loss"]
    worst_eval = abs(ref_eval - res_eval)
    if worst > tolerance or worst_eval > tolerance:
        fail("after resuming, losses differ from the uninterrupted run by up to %g (eval %g), over %g"
             % (worst, worst_eval, tolerance))
    say("%s -> %s at step 10: steps 11..%d within %g of the uninterrupted run (eval %g)"
        % (" ".join(source), " ".join(target), later[-1], worst, worst_eval))


def flip_a_byte(checkpoint):
    """Flips one byte in the middle of the checkpoint's largest shard file; returns the file's name."""
    shards = glob.glob(os.path.join(checkpoint, "*.safetensors"))
    if not shards:
        fail("%s has no .safetensors shard" % checkpoint)
    shard = max(shards, key=os.path.getsize)
    with open(shard, "r+b") as f:
        f.seek(os.path.getsize(shard) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    return os.path.basename(shard)


def check_damaged(dtrain, args, folder):
    checkpoints = os.path.join(folder, "checkpoints")
    first = os.path.join(folder, "first.jsonl")
    run([dtrain, "train"] + args + ["--checkpoint-dir", checkpoints, "--checkpoint-every", "10", "--keep-last", "3",
                                    "--metrics", first])
    saved = sorted(os.path.basename(p) for p in glob.glob(os.path.join(checkpoints, "step-*")))
    if saved != ["step-00000010", "step-00000020", "step-00000030"]:
        fail("expected the checkpoints of steps 10, 20 and 30, found %s" % saved)

    # Every checkpoint damaged (in a copy): an error, not a fresh start.
    all_damaged = os.path.join(folder, "all-damaged")
    shutil.copytree(checkpoints, all_damaged)
    for name in saved:
        flip_a_byte(os.path.join(all_damaged, name))
    code, output = run([dtrain, "train"] + args + ["--checkpoint-dir", all_damaged, "--resume"], expect_code=None)
    if code == 0 or "no checkpoint in %s can be loaded" % all_damaged not in output:
        fail("with every checkpoint damaged, --resume must stop with 'no checkpoint in DIR can be loaded'")
    if "starting at step 0" in output:
        fail("with every checkpoint damaged, --resume must not start at step 0")
    say("every checkpoint damaged: exit %d, 'no checkpoint ... can be loaded'" % code)

    # Other settings than the checkpoint's: said, each with what it changes (a copy; the run goes on).
    changed = os.path.join(folder, "changed-settings")
    shutil.copytree(checkpoints, changed)
    _, output = run([dtrain, "train"] + args + ["--checkpoint-dir", changed, "--resume", "--seed", "7",
                                                "--steps", "40"])
    for expected in ("note: --seed 7 differs from the checkpoint's 0", "note: --steps 40 differs from the checkpoint's 30"):
        if expected not in output:
            fail("resuming with --seed 7 --steps 40 must say %r" % expected)
    say("changed --seed and --steps on resume: both named")

    shard = flip_a_byte(os.path.join(checkpoints, "step-00000030"))
    _, output = run([dtrain, "train"] + args + ["--checkpoint-dir", checkpoints, "--resume",
                                                "--metrics", os.path.join(folder, "resumed.jsonl")])
    passed_over = [line for line in output.splitlines() if line.startswith("not resuming from step-00000030")]
    if not passed_over or shard not in passed_over[0] or "checksum" not in passed_over[0]:
        fail("expected 'not resuming from step-00000030: ... %s ... checksum' in the output" % shard)
    if "resuming from step 20 " not in output:
        fail("expected 'resuming from step 20' after passing over step 30")
    if "note: " in output:
        fail("resuming with the checkpoint's own settings must not note any difference")
    compare_after(read_metrics(first), read_metrics(os.path.join(folder, "resumed.jsonl")), 20)


def expect_disk_full_handled(dtrain, args, checkpoints, env=None):
    """Runs with checkpoints at steps 10, 20, 30 where the second cannot be written."""
    command = [dtrain, "train"] + args + SAVING + ["--checkpoint-dir", checkpoints, "--checkpoint-every", "10",
                                                  "--keep-last", "1"]
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        code, output = run(command, expect_code=None)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if code == 0:
        fail("the run succeeded although the second checkpoint cannot fit")
    expected = "cannot write the checkpoint of step 20"
    if expected not in output or "No space left on device" not in output or "step 10 is untouched" not in output:
        fail("expected '%s ... No space left on device ... step 10 is untouched' in the output" % expected)
    left = sorted(os.listdir(checkpoints))
    if left != ["step-00000010"]:
        fail("after the failed save the folder must hold exactly step-00000010, found %s" % left)
    run([dtrain, "checkpoint", "inspect", os.path.join(checkpoints, "step-00000010")])


def check_disk_full(dtrain, args, folder):
    # Always: a simulated full disk (DTRAIN_FAULT_DISK_BYTES, src/checkpoint/
    # fault_injection.h): each rank's writes fail with ENOSPC after 1.6 MB, room
    # for its ~1.1 MB share of one checkpoint (the MLP's weights and SGD
    # momentum, 2.2 MB over 2 ranks) but not of two.
    expect_disk_full_handled(dtrain, args, os.path.join(folder, "simulated"),
                             env={"DTRAIN_FAULT_DISK_BYTES": str(1600 * 1000)})
    say("simulated full disk: clear error, step 10 intact, nothing partial left")
    # With root, also a real one: a 3 MB tmpfs.
    if os.geteuid() != 0:
        say("the real full disk (a tmpfs mount) needs root: checked the simulated one only")
        return
    mount_point = os.path.join(folder, "small-disk")
    os.makedirs(mount_point)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", mount_point]).returncode != 0:
        say("cannot mount a tmpfs here: checked the simulated full disk only")
        return
    try:
        expect_disk_full_handled(dtrain, args, os.path.join(mount_point, "checkpoints"))
        say("real full disk: clear error, step 10 intact, nothing partial left")
    finally:
        subprocess.run(["umount", mount_point])


def check_crash_points(dtrain, args, folder):
    """Kills rank 0 at every crash point of the checkpoint writers in turn
    (DTRAIN_FAULT_CRASH_AT=K, src/checkpoint/fault_injection.h): saves at
    steps 10, 20 and 30 with --keep-last 1. After each crash --resume finds a
    complete checkpoint (or none, when the first save was cut) and finishes
    the run bitwise equal to the uninterrupted one, leaving only the last
    checkpoint behind."""
    reference = reference_run(dtrain, args, folder)
    crash_points = 0
    for k in range(1, 100):
        case = os.path.join(folder, "crash-%d" % k)
        checkpoints = os.path.join(case, "checkpoints")
        os.makedirs(case)
        saves = ["--checkpoint-dir", checkpoints, "--checkpoint-every", "10", "--keep-last", "1"]
        os.environ["DTRAIN_FAULT_CRASH_AT"] = str(k)
        try:
            code, output = run([dtrain, "train"] + args + saves + ["--metrics", os.path.join(case, "crashed.jsonl")],
                               expect_code=None)
        finally:
            del os.environ["DTRAIN_FAULT_CRASH_AT"]
        if code == 0:
            break  # k is past the last crash point
        where = [line for line in output.splitlines() if "DTRAIN_FAULT_CRASH_AT=%d" % k in line]
        if not where:
            fail("the run with DTRAIN_FAULT_CRASH_AT=%d failed without reaching its crash point" % k)
        crash_points = k
        newest = newest_complete_checkpoint(checkpoints)  # what the crash left: the step --resume must take
        resumed_path = os.path.join(case, "resumed.jsonl")
        _, output = run([dtrain, "train"] + args + saves + ["--resume", "--metrics", resumed_path])
        started = re.search(r"resuming from step (\d+) ", output)
        first_step = int(started.group(1)) if started else 0
        if not started and "no checkpoint in" not in output:
            fail("crash %d: --resume neither resumed nor said there was no checkpoint" % k)
        if first_step != max(newest, 0):
            fail("crash %d (%s): the newest complete checkpoint is step %d, but --resume started at step %d"
                 % (k, where[0], newest, first_step))
        resumed = read_metrics(resumed_path)
        if first_step < max(step_losses(reference)):
            compare_after(reference, resumed, first_step)
        elif final_record(resumed) is None or final_record(resumed)["eval_loss"] != final_record(reference)["eval_loss"]:
            fail("crash %d: resumed at the last step, but the final evaluation differs" % k)
        left = sorted(os.listdir(checkpoints))
        last = max(step_losses(reference))
        if first_step < last:
            # The resumed run saved (and pruned): only the last checkpoint is left.
            if left != ["step-%08d" % last]:
                fail("crash %d: after the resumed run the folder holds %s, expected only step-%08d" % (k, left, last))
        else:
            # Resumed at the last step, so nothing was saved after the crash: what it left must be
            # the last checkpoint, older complete ones (pruned by the next save) and folders
            # --resume ignores (.tmp-*).
            strays = [name for name in left if name != "step-%08d" % last and ".tmp-" not in name
                      and not complete_checkpoint(checkpoints, int(name[5:]) if name[5:].isdigit() else -1)]
            if "step-%08d" % last not in left or strays:
                fail("crash %d: the folder holds %s (unexpected: %s)" % (k, left, strays))
        say("crash %d: %s; resumed from step %d, bitwise equal, nothing left behind" % (k, where[0].split("itself ")[-1],
                                                                                    first_step))
    if crash_points < 10:
        fail("only %d crash points were passed; the writers mark more than that" % crash_points)
    say("all %d crash points: a complete checkpoint survived each" % crash_points)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("check", choices=["kill-resume", "signal", "nonfinite", "damaged", "disk-full", "crash-points",
                                          "reshard"])
    parser.add_argument("--from", dest="source", default="", help="reshard: the saving run's strategy flags")
    parser.add_argument("--to", dest="target", default="", help="reshard: the resuming run's strategy flags")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="reshard: the largest loss difference")
    parser.add_argument("--saving", default="",
                        help="signal, disk-full: flags for the runs that save (e.g. --checkpoint-async)")
    parser.add_argument("dtrain")
    parser.add_argument("train_args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    SAVING.extend(options.saving.split())
    args = [a for a in options.train_args if a != "--"] + ["--log-every", "1"]
    with tempfile.TemporaryDirectory(prefix="dtrain-ckpt-") as folder:
        if options.check == "reshard":
            if "--strategy" not in options.source.split() or "--strategy" not in options.target.split():
                fail("reshard needs --from and --to, each with --strategy")
            check_reshard(options.dtrain, args, folder, options.source.split(), options.target.split(),
                          options.tolerance)
            say("PASS")
            return
        {"kill-resume": check_kill_resume, "signal": check_signal, "nonfinite": check_nonfinite,
         "damaged": check_damaged, "disk-full": check_disk_full,
     "crash-points": check_crash_points}[options.check](options.dtrain, args, folder)
    say("PASS")


if __name__ == "__main__":
    main()
