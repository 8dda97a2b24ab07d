#!/usr/bin/env python3
"""End-to-end checks of automatic restart (dtrain train --max-restarts K).

Ranks are killed with SIGKILL at chosen steps through the test hook
DTRAIN_TEST_KILL_AT_STEP=STEP:RANK[:ATTEMPT],... (src/train/restarts.h): the
rank kills itself once STEP is done, on attempt ATTEMPT only (from 0), so a
fast run is killed exactly where the test says, without racing it from outside.
--log-every 1 is added everywhere, so every step has a metrics line.

    check_restarts.py kills --kills 25:1:0,47:0:1 --every N DTRAIN -- TRAIN_ARGS...
        A reference run; then the same run with --checkpoint-dir,
        --checkpoint-every N and --max-restarts (default 3), killed as
        --kills says. It must exit 0 having restarted once per kill, each
        restart logged; its final line says restarts = the kills and
        steps_lost <= kills x N (and equal to what the launcher logged); every
        step's loss, including the steps redone after a restart, and the final
        loss and evaluation equal the reference bitwise; its --trace has a
        "restart" instant on every rank with the counts. Prints the time from
        each kill to the first step after the restart. --random-kills K
        --seed S instead draws K kills at random steps and ranks (make
        check-long's chaos run, tests/long/check_long.sh).

    check_restarts.py same-step --step S --max-restarts K DTRAIN -- TRAIN_ARGS...
        Rank 1 is killed after step S on every attempt: the job must stop with
        a non-zero exit, after at most K restarts, with the message that names
        the checkpoint it cannot get past and the fix (--resume once fixed).
"""

import argparse
import json
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_dtrain import TIMEOUT_S, fail, read_metrics, run, say  # noqa: E402


def final_record(records):
    finals = [r for r in records if r.get("final")]
    return finals[-1] if finals else None


def timed_run(command, env):
    """Runs `command`, printing its output; returns (exit code, [(seconds since start, line)])."""
    say("running: " + " ".join(shlex.quote(a) for a in command))
    start = time.time()
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           env=env)
    lines = []
    for raw in job.stdout:
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        print(line, flush=True)
        lines.append((time.time() - start, line))
        if time.time() - start > TIMEOUT_S:
            job.kill()
            fail("still running after %d s" % TIMEOUT_S)
    return job.wait(), lines


def back_to_training(lines):
    """Seconds from each kill to the first step logged after the restart that follows it."""
    delays, killed_at, resumed = [], None, False
    for at, line in lines:
        if "DTRAIN_TEST_KILL_AT_STEP" in line and "kills itself" in line:
            killed_at, resumed = at, False
        elif killed_at is not None and line.startswith("resuming from step"):
            resumed = True
        elif killed_at is not None and resumed and re.match(r"step \d+/\d+", line):
            delays.append(at - killed_at)
            killed_at = None
    return delays


def draw_kills(count, seed, steps, ranks):
    """`count` kills at increasing steps (each attempt then passes its own) and random ranks."""
    rng = random.Random(seed)
    chosen = sorted(rng.sample(range(5, steps - 5), count))
    return ",".join("%d:%d:%d" % (step, rng.randrange(ranks), attempt) for attempt, step in enumerate(chosen))


def check_kills(options, dtrain, args, folder):
    reference = os.path.join(folder, "reference.jsonl")
    run([dtrain, "train"] + args + ["--metrics", reference])
    ref = read_metrics(reference)
    ref_losses = {r["step"]: r["loss"] for r in ref if "loss" in r and "final" not in r}
    kills = options.kills or draw_kills(options.random_kills, options.seed, max(ref_losses), options.ranks)
    count = len(kills.split(","))
    say("kills (STEP:RANK:ATTEMPT): " + kills + ("" if options.kills else " (--random-kills %d --seed %d)"
                                                 % (options.random_kills, options.seed)))
    metrics = os.path.join(folder, "restarted.jsonl")
    trace = os.path.join(folder, "restarted.trace.json")
    env = dict(os.environ, DTRAIN_TEST_KILL_AT_STEP=kills)
    code, lines = timed_run([dtrain, "train"] + args + ["--trace", trace,
        "--checkpoint-dir", os.path.join(folder, "checkpoints"), "--checkpoint-every", str(options.every),
        "--max-restarts", str(options.max_restarts), "--metrics", metrics], env)
    if code != 0:
        fail("the job exited with %d, expected 0 after %d restarts" % (code, count))
    logged = [line for _, line in lines if line.startswith("dtrain launch: restart ")]
    if len(logged) != count:
        fail("expected %d 'dtrain launch: restart' lines, found %d" % (count, len(logged)))
    lost_logged = sum(int(re.search(r", (\d+) steps? lost", line).group(1)) for line in logged)
    records = read_metrics(metrics)
    final = final_record(records)
    if final["restarts"] != count:
        fail("final line: restarts %s, expected %d" % (final["restarts"], count))
    if final["steps_lost"] != lost_logged or final["steps_lost"] > count * options.every:
        fail("final line: steps_lost %s, expected %d as logged and at most %d x %d"
             % (final["steps_lost"], lost_logged, count, options.every))
    redone = 0
    for r in records:
        if "loss" in r and "final" not in r:
            if r["loss"] != ref_losses[r["step"]]:
                fail("step %d: loss %r after restarts != uninterrupted %r (must be bitwise equal)"
                     % (r["step"], r["loss"], ref_losses[r["step"]]))
            redone += 1
    ref_final = final_record(ref)
    for key in ("steps", "loss", "eval_loss"):
        if final[key] != ref_final[key]:
            fail("final %s: %r after restarts != uninterrupted %r" % (key, final[key], ref_final[key]))
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    marks = [e for e in events if e.get("name") == "restart"]
    if not marks or any(e["args"]["restarts"] != count or e["args"]["steps_lost"] != final["steps_lost"] for e in marks):
        fail("the trace's 'restart' instants %s do not say %d restarts, %d steps lost" % (marks, count, final["steps_lost"]))
    delays = back_to_training(lines)
    say("%d restarts, %d steps lost; %d step lines (redone ones included) and the final loss %r and eval_loss %r "
        "equal the uninterrupted run bitwise" % (count, final["steps_lost"], redone, final["loss"], final["eval_loss"]))
    say("from a kill to training again: " + ", ".join("%.1f s" % d for d in delays))
    if len(delays) != count:
        fail("found %d restarts that got back to training, expected %d" % (len(delays), count))


def check_same_step(options, dtrain, args, folder):
    env = dict(os.environ, DTRAIN_TEST_KILL_AT_STEP="%d:1" % options.step)
    code, lines = timed_run([dtrain, "train"] + args + [
        "--checkpoint-dir", os.path.join(folder, "checkpoints"), "--checkpoint-every", str(options.every),
        "--max-restarts", str(options.max_restarts)], env)
    text = "\n".join(line for _, line in lines)
    if code == 0:
        fail("a job that fails at step %d on every attempt exited 0" % options.step)
    restarts = len(re.findall(r"^dtrain launch: restart ", text, re.M))
    if restarts > options.max_restarts:
        fail("%d restarts, more than --max-restarts %d" % (restarts, options.max_restarts))
    last = (options.step // options.every) * options.every
    expected = "without getting past the checkpoint of step %d" % last
    if expected not in text or "run the same command with --resume" not in text:
        fail("expected the give-up message naming the checkpoint of step %d and the fix" % last)
    say("exit %d after %d restarts, naming the checkpoint of step %d and the fix" % (code, restarts, last))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", choices=["kills", "same-step"])
    parser.add_argument("--kills", help="STEP:RANK:ATTEMPT,... (DTRAIN_TEST_KILL_AT_STEP)")
    parser.add_argument("--random-kills", type=int, default=0, help="draw this many kills instead")
    parser.add_argument("--seed", type=int, default=int(time.time()), help="for --random-kills")
    parser.add_argument("--ranks", type=int, default=2, help="for --random-kills: the job's ranks")
    parser.add_argument("--step", type=int, default=15, help="same-step: where rank 1 dies every time")
    parser.add_argument("--every", type=int, default=10, help="--checkpoint-every")
    parser.add_argument("--max-restarts", type=int, default=3)
    parser.add_argument("dtrain")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- TRAIN_ARGS...")
    options = parser.parse_args()
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    if options.check == "kills" and not (options.kills or options.random_kills):
        parser.error("kills needs --kills or --random-kills")
    with tempfile.TemporaryDirectory(prefix="dtrain-restarts-") as folder:
        check = check_kills if options.check == "kills" else check_same_step
        check(options, options.dtrain, args + ["--log-every", "1"], folder)


if __name__ == "__main__":
    main()
