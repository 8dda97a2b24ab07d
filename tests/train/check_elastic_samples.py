#!/usr/bin/env python3
"""End-to-end check of elastic world size (issue 19, item 2): a job resumed
from a checkpoint on fewer or more ranks sees every sample of an epoch exactly
once, with the global batch (--batch-size) unchanged.

    check_elastic_samples.py resize --from 4 --to 2 --kill 13:2 --every 5 [--epoch 0] DTRAIN -- TRAIN_ARGS...
        1. `dtrain train --nproc FROM TRAIN_ARGS --checkpoint-dir D
           --checkpoint-every EVERY --log-every 1`, rank RANK killed (SIGKILL)
           once step STEP is done (DTRAIN_TEST_KILL_AT_STEP=STEP:RANK,
           src/train/restarts.h): it must exit non-zero;
        2. the same command with --nproc TO --resume: it must exit 0, resumed
           from the newest checkpoint (the largest multiple of EVERY <= STEP);
        3. both runs log their samples (DTRAIN_TEST_SAMPLE_LOG,
           src/train/sample_log.h) and check_samples.py --epoch E must pass on
           the two logs: every index of the epoch exactly once over the
           committed steps. The epoch must span the resize.
        It also asserts where the steps ran: the log's steps count from 0, so
        the steps the progress line calls 1..R (R the resumed step) ran at
        world FROM, those from R+1 on at world TO, and the steps R+1..STEP
        were done at FROM by every rank, then redone at TO. (The first step
        after STEP may also be in the first log, begun by the ranks that were
        not killed and never finished: it must be incomplete there.)
        Runs the self-test below first.

    check_elastic_samples.py self-test
        check_samples.py must pass on synthetic logs of a correct resize and
        fail on ones with an index repeated, with a step missing and with a
        rank's record missing, so that it demonstrably can fail.
"""

import argparse
import json
import os
import random
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_samples  # noqa: E402
from run_dtrain import fail, run, say  # noqa: E402


def shard(batch, world, rank):
    """Rank `rank`'s contiguous part of `batch` as shard_range splits it (the first len % world get one more)."""
    base, extra = divmod(len(batch), world)
    offset = rank * base + min(rank, extra)
    return batch[offset:offset + base + (1 if rank < extra else 0)]


def write_synthetic(path, runs, n, b, seed=1):
    """A sample log as ranks would write it: `runs` is [(world, first step, last step)] in one file, attempt 0."""
    rng = random.Random(seed)
    stream = []
    for epoch in range(4):
        order = list(range(n))
        random.Random(epoch).shuffle(order)
        stream += order
    lines = []
    for world, first, last in runs:
        for step in range(first, last + 1):
            batch = stream[step * b:(step + 1) * b]
            ranks = list(range(world))
            rng.shuffle(ranks)  # ranks append in any order
            for rank in ranks:
                lines.append({"attempt": 0, "world": world, "rank": rank, "step": step, "dataset_size": n,
                              "global_batch": b, "indices": shard(batch, world, rank)})
    with open(path, "w") as log:
        for line in lines:
            log.write(json.dumps(line) + "\n")
    return lines


def rewrite(path, change):
    """Applies `change` to the list of records of `path` and writes them back."""
    with open(path) as log:
        records = [json.loads(line) for line in log if line.strip()]
    records = change(records)
    with open(path, "w") as log:
        for record in records:
            log.write(json.dumps(record) + "\n")


def self_test():
    n, b = 60, 7  # epoch 0: steps 0..8
    with tempfile.TemporaryDirectory(prefix="dtrain-samples-") as folder:
        first, second = os.path.join(folder, "1.jsonl"), os.path.join(folder, "2.jsonl")

        def reset():
            write_synthetic(first, [(4, 0, 5)], n, b)  # killed after step 5 (from 0)
            write_synthetic(second, [(3, 4, 10)], n, b)  # resumed from step 4 at world 3

        def expect(what, should_pass, paths=None, needle=None):
            result = check_samples.analyse(paths or [first, second], 0)
            if result.ok != should_pass:
                fail("self-test: %s: check_samples %s, expected it to %s (errors: %s)"
                     % (what, "passed" if result.ok else "failed", "pass" if should_pass else "fail", result.errors))
            if needle and not any(needle in error for error in result.errors):
                fail("self-test: %s: no error says %r: %s" % (what, needle, result.errors))
            say("self-test: %s: %s as expected%s" % (what, "passes" if should_pass else "fails",
                                                    "" if should_pass else " (%s)" % result.errors[0][:150]))
            return result

        reset()
        result = expect("a correct shrink from 4 to 3 ranks", True)
        if result.redone != [4, 5] or result.committed[3]["world"] != 4 or result.committed[4]["world"] != 3:
            fail("self-test: redone %s, worlds of steps 3, 4: %s, %s; expected [4, 5], 4, 3"
                 % (result.redone, result.committed[3]["world"], result.committed[4]["world"]))
        expect("the logs in the wrong order (the killed run's steps 4-5 count)", True, [second, first])

        reset()
        with open(first) as log:
            step2 = next(r for r in map(json.loads, log) if r["step"] == 2 and r["rank"] == 0)

        def repeat(records):
            target = next(r for r in records if r["step"] == 6 and r["rank"] == 1)
            target["indices"][0] = step2["indices"][0]
            return records
        rewrite(second, repeat)
        expect("one index repeated (and so one missing)", False, needle="repeats 1 indices: %d in steps 2, 6"
               % step2["indices"][0])

        reset()
        rewrite(second, lambda records: [r for r in records if r["step"] != 7])
        expect("a step missing", False, needle="step 7 is missing")

        reset()
        rewrite(second, lambda records: [r for r in records if not (r["step"] == 5 and r["rank"] == 2)])
        expect("a rank's record missing in the latest run of a step", False, needle="step 5")

        reset()
        rewrite(second, lambda records: [r for r in records if r["step"] != 4])  # resumed at 5: 4 counts from run 1
        expect("the earlier run's complete step used when the later one skipped it", True)

        write_synthetic(first, [(4, 0, 8)], n, b)
        expect("one uninterrupted run", True, [first])
        rewrite(first, lambda records: [r for r in records if r["step"] != 8])
        expect("one run stopping before the epoch's last step", False, [first], needle="step 8 is missing")


def check_resize(options, dtrain, args):
    self_test()
    kill_step, kill_rank = (int(x) for x in options.kill.split(":"))
    with tempfile.TemporaryDirectory(prefix="dtrain-elastic-") as folder:
        logs = [os.path.join(folder, "samples-%d.jsonl" % i) for i in (1, 2)]
        common = args + ["--checkpoint-dir", os.path.join(folder, "checkpoints"),
                         "--checkpoint-every", str(options.every), "--log-every", "1"]
        code, _ = run([dtrain, "train", "--nproc", str(options.from_world)] + common, expect_code=None,
                      env={"DTRAIN_TEST_KILL_AT_STEP": options.kill, "DTRAIN_TEST_SAMPLE_LOG": logs[0]})
        if code == 0:
            fail("the run whose rank %d was killed after step %d exited 0" % (kill_rank, kill_step))
        _, output = run([dtrain, "train", "--nproc", str(options.to_world)] + common + ["--resume"],
                        env={"DTRAIN_TEST_SAMPLE_LOG": logs[1]})
        match = re.search(r"^resuming from step (\d+) .* on (\d+) ranks", output, re.M)
        expected = kill_step // options.every * options.every
        if not match or int(match.group(1)) != expected or int(match.group(2)) != options.from_world:
            fail("expected 'resuming from step %d (... on %d ranks)' in the resumed run's output"
                 % (expected, options.from_world))
        resumed = expected

        result = check_samples.analyse(logs, options.epoch)
        for line in check_samples.summary(result, logs, options.epoch):
            say(line)
        if not result.ok:
            fail("check_samples --epoch %d: %s" % (options.epoch, "; ".join(result.errors)))
        n, b = result.dataset_size, result.global_batch
        first_step, last_step = options.epoch * n // b, ((options.epoch + 1) * n - 1) // b
        say("epoch %d: each of the %d samples exactly once over steps %d..%d (global batch %d: %s at world %d, %s at %d)"
            % (options.epoch, n, first_step, last_step, b, [len(shard(range(b), options.from_world, r))
               for r in range(options.from_world)], options.from_world,
               [len(shard(range(b), options.to_world, r)) for r in range(options.to_world)], options.to_world))
        if not first_step < resumed <= last_step:
            fail("the resize at step %d is not inside epoch %d (steps %d..%d): pick other --steps/--batch-size"
                 % (resumed, options.epoch, first_step, last_step))

        # Where each step ran (log steps count from 0; the progress line's step s is log step s - 1).
        for step, committed in sorted(result.committed.items()):
            want = (0, options.from_world) if step < resumed else (1, options.to_world)
            if (committed["run"][0], committed["world"]) != want:
                fail("log step %d counts from log %d at world %d, expected log %d at world %d"
                     % (step, committed["run"][0] + 1, committed["world"], want[0] + 1, want[1]))
        with open(logs[0]) as log:
            killed_run = [json.loads(line) for line in log if line.strip()]
        ranks_of = {}
        for record in killed_run:
            ranks_of.setdefault(record["step"], set()).add(record["rank"])
        complete = set(range(options.from_world))
        redone_complete = [s for s in result.redone if ranks_of.get(s) == complete]
        if redone_complete != list(range(resumed, kill_step)):
            fail("log steps %s were done by all %d ranks and then redone; expected %d..%d (steps %d..%d)"
                 % (redone_complete, options.from_world, resumed, kill_step - 1, resumed + 1, kill_step))
        if sorted(ranks_of) != list(range(max(ranks_of) + 1)) or max(ranks_of) > kill_step:
            fail("the killed run logged steps %s; expected 0..%d at most" % (sorted(ranks_of), kill_step))
        if kill_step in ranks_of and (kill_rank in ranks_of[kill_step] or ranks_of[kill_step] == complete):
            fail("log step %d in the killed run has ranks %s: rank %d was killed before it"
                 % (kill_step, sorted(ranks_of[kill_step]), kill_rank))
        say("steps 1..%d ran at world %d, steps %d..%d were redone at world %d after the kill, and the run went on at "
            "world %d to step %d%s" % (resumed, options.from_world, resumed + 1, kill_step, options.to_world,
                                       options.to_world, max(result.committed) + 1,
                                       "" if kill_step not in ranks_of else
                                       " (step %d was begun by ranks %s of the killed run, never finished)"
                                       % (kill_step + 1, sorted(ranks_of[kill_step]))))


def main():
    argv = sys.argv[1:]
    train_args = []
    if "--" in argv:
        split = argv.index("--")
        argv, train_args = argv[:split], argv[split + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", choices=["resize", "self-test"])
    parser.add_argument("--from", dest="from_world", type=int, default=4, help="resize: the first run's ranks")
    parser.add_argument("--to", dest="to_world", type=int, default=2, help="resize: the resumed run's ranks")
    parser.add_argument("--kill", default="13:2", help="resize: STEP:RANK (DTRAIN_TEST_KILL_AT_STEP)")
    parser.add_argument("--every", type=int, default=5, help="resize: --checkpoint-every")
    parser.add_argument("--epoch", type=int, default=0, help="resize: the epoch to check")
    parser.add_argument("dtrain", nargs="?")
    options = parser.parse_intermixed_args(argv)
    if options.check == "self-test":
        self_test()
    else:
        if not options.dtrain:
            parser.error("resize needs DTRAIN -- TRAIN_ARGS")
        check_resize(options, options.dtrain, train_args)
    say("PASS")


if __name__ == "__main__":
    main()
