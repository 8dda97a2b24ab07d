#!/usr/bin/env python3
"""Checks that the steps of one or more training runs saw every sample of an
epoch exactly once, from the logs of DTRAIN_TEST_SAMPLE_LOG (src/train/sample_log.h).

    check_samples.py --epoch E LOG [LOG...]

The LOG files are given in the order the runs happened (a run killed, then the
run that resumed it, perhaps at another world size). Each line is one rank's
record of one step: {"attempt", "world", "rank", "step", "dataset_size",
"global_batch", "indices"}, steps counted from 0.

A run is a (file, attempt) pair, later files and then later attempts within a
file being later runs. For each step the records that count (the committed
ones) are those of the latest run that logged the step: they must come from
exactly `world` distinct ranks 0..world-1 of that run, and their indices,
concatenated in rank order, are the step's global batch, of `global_batch`
entries. Steps logged by an earlier run too were redone (after a failure and a
resume from an older checkpoint); the earlier records do not count.

The committed global batches of steps 0, 1, 2, ... concatenated are the index
stream; its positions [E*N, (E+1)*N) (N = dataset_size) must hold each index
0..N-1 exactly once. That needs every step from 0 to the one holding position
(E+1)*N - 1. On failure it says which step is missing, or which indices were
repeated (and in which steps) and which are missing. It prints a summary: the
steps, the world size of each range of steps, the steps redone. Exit code 0
only when everything holds, 1 otherwise (2 for bad arguments).

Importable: analyse(paths, epoch) returns an Analysis (see below) without
printing or exiting.
"""

import argparse
import json
import sys
from collections import defaultdict

FIELDS = ("attempt", "world", "rank", "step", "dataset_size", "global_batch", "indices")


class Analysis:
    """What analyse() found.

    errors:     list of messages; empty when every rule holds.
    committed:  {step: {"run": (file index, attempt), "world": W, "batch": [...]}}
                for the steps whose records count.
    runs_of:    {step: [run, ...]} every run that logged the step, in order.
    ranks_of:   {step: {run: (world, [ranks that logged the step])}}.
    redone:     sorted steps logged by more than one run.
    dataset_size, global_batch: as the committed records say (None if none).
    ranges:     [(first step, last step, run, world)], consecutive committed
                steps of one run and world size.
    """

    def __init__(self):
        self.errors = []
        self.committed = {}
        self.runs_of = {}
        self.ranks_of = {}
        self.redone = []
        self.dataset_size = None
        self.global_batch = None
        self.ranges = []

    @property
    def ok(self):
        return not self.errors


def read_records(paths):
    """[(file index, line number, record)] of every file, in order; raises ValueError on a bad line."""
    records = []
    for file_index, path in enumerate(paths):
        with open(path) as log:
            for number, line in enumerate(log, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError("%s line %d is not JSON: %s" % (path, number, error))
                missing = [f for f in FIELDS if f not in record]
                if missing:
                    raise ValueError("%s line %d lacks %s" % (path, number, ", ".join(missing)))
                records.append((file_index, number, record))
    return records


def describe_steps(steps):
    """'3, 7-9, 12' for a collection of steps."""
    steps = sorted(set(steps))
    parts, start = [], None
    for i, step in enumerate(steps):
        if start is None:
            start = step
        if i + 1 == len(steps) or steps[i + 1] != step + 1:
            parts.append(str(start) if start == step else "%d-%d" % (start, step))
            start = None
    return ", ".join(parts)


def describe_ranks(world, ranks):
    if ranks == list(range(world)):
        return "all %d ranks" % world
    return "ranks %s of %d (incomplete)" % (", ".join(map(str, ranks)), world)


def analyse(paths, epoch):
    result = Analysis()
    try:
        records = read_records(paths)
    except (OSError, ValueError) as error:
        result.errors.append(str(error))
        return result
    if not records:
        result.errors.append("no records in " + ", ".join(paths))
        return result

    # step -> run -> [records]
    by_step = defaultdict(lambda: defaultdict(list))
    for file_index, number, record in records:
        run = (file_index, record["attempt"])
        by_step[record["step"]][run].append((paths[file_index], number, record))

    for step in sorted(by_step):
        runs = sorted(by_step[step])
        result.runs_of[step] = runs
        result.ranks_of[step] = {run: (by_step[step][run][0][2]["world"], sorted(r["rank"] for _, _, r in
                                                                             by_step[step][run])) for run in runs}
        latest = runs[-1]
        entries = by_step[step][latest]
        where = "step %d (%s, attempt %d)" % (step, paths[latest[0]], latest[1])
        worlds = {r["world"] for _, _, r in entries}
        sizes = {(r["dataset_size"], r["global_batch"]) for _, _, r in entries}
        if len(worlds) != 1 or len(sizes) != 1:
            result.errors.append("%s: the ranks' records disagree on world %s or (dataset_size, global_batch) %s"
                                 % (where, sorted(worlds), sorted(sizes)))
            continue
        world = worlds.pop()
        dataset_size, global_batch = sizes.pop()
        ranks = sorted(r["rank"] for _, _, r in entries)
        if ranks != list(range(world)):
            result.errors.append("%s: records from ranks %s, expected each of 0..%d once (world %d)"
                                 % (where, ranks, world - 1, world))
            continue
        batch = []
        for _, _, r in sorted(entries, key=lambda e: e[2]["rank"]):
            batch.extend(r["indices"])
        if len(batch) != global_batch:
            result.errors.append("%s: the ranks' indices add up to %d samples, expected the global batch of %d"
                                 % (where, len(batch), global_batch))
            continue
        if result.dataset_size is None:
            result.dataset_size, result.global_batch = dataset_size, global_batch
        elif (dataset_size, global_batch) != (result.dataset_size, result.global_batch):
            result.errors.append("%s: dataset_size %d and global_batch %d, but earlier steps had %d and %d"
                                 % (where, dataset_size, global_batch, result.dataset_size, result.global_batch))
            continue
        result.committed[step] = {"run": latest, "world": world, "batch": batch}

    result.redone = sorted(step for step, runs in result.runs_of.items() if len(runs) > 1)
    for step in sorted(result.committed):
        c = result.committed[step]
        last = result.ranges[-1] if result.ranges else None
        if last and last[1] == step - 1 and last[2] == c["run"] and last[3] == c["world"]:
            result.ranges[-1] = (last[0], step, last[2], last[3])
        else:
            result.ranges.append((step, step, c["run"], c["world"]))
    if result.errors:
        return result

    n, b = result.dataset_size, result.global_batch
    first, end = epoch * n, (epoch + 1) * n  # positions [first, end) of the stream
    for step in range(0, (end - 1) // b + 1):
        if step not in result.committed:
            result.errors.append("step %d is missing: epoch %d (positions %d..%d of the stream, %d per step) needs "
                                 "steps 0..%d, logged are steps %s"
                                 % (step, epoch, first, end - 1, b, (end - 1) // b, describe_steps(result.committed)))
            return result
    seen = defaultdict(list)  # index -> steps that used it within the epoch
    outside = []
    for step in range(first // b, (end - 1) // b + 1):
        for offset, index in enumerate(result.committed[step]["batch"]):
            if first <= step * b + offset < end:
                if 0 <= index < n:
                    seen[index].append(step)
                else:
                    outside.append((index, step))
    repeated = {index: steps for index, steps in seen.items() if len(steps) > 1}
    missing = [index for index in range(n) if index not in seen]
    for index, step in outside:
        result.errors.append("index %d (step %d) is outside the dataset 0..%d" % (index, step, n - 1))
    if repeated:
        result.errors.append("epoch %d repeats %d indices: %s" % (epoch, len(repeated), "; ".join(
            "%d in steps %s" % (index, ", ".join(map(str, steps))) for index, steps in sorted(repeated.items()))))
    if missing:
        result.errors.append("epoch %d misses %d indices: %s (its steps are %d..%d)"
                             % (epoch, len(missing), ", ".join(map(str, missing)), first // b, (end - 1) // b))
    return result


def summary(result, paths, epoch):
    lines = []
    if result.committed:
        lines.append("%d steps committed (%s); dataset_size %s, global_batch %s"
                     % (len(result.committed), describe_steps(result.committed), result.dataset_size,
                        result.global_batch))
    for first, last, run, world in result.ranges:
        lines.append("  steps %s: world %d (%s, attempt %d)"
                     % (first if first == last else "%d-%d" % (first, last), world, paths[run[0]], run[1]))
    lines.append("%d steps redone: %s" % (len(result.redone), describe_steps(result.redone) or "none"))
    for step in result.redone:
        earlier = result.runs_of[step][:-1]
        lines.append("  step %d: logged earlier by %s" % (step, "; ".join(
            "%s attempt %d: %s" % (paths[f], a, describe_ranks(*result.ranks_of[step][(f, a)])) for f, a in earlier)))
    if result.dataset_size and result.global_batch:
        n, b = result.dataset_size, result.global_batch
        lines.append("epoch %d: stream positions %d..%d, steps %d..%d"
                     % (epoch, epoch * n, (epoch + 1) * n - 1, epoch * n // b, ((epoch + 1) * n - 1) // b))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epoch", type=int, default=0, help="the epoch to check (default 0)")
    parser.add_argument("logs", nargs="+", metavar="LOG", help="DTRAIN_TEST_SAMPLE_LOG files, in run order")
    options = parser.parse_args(argv)
    if options.epoch < 0:
        parser.error("--epoch must be >= 0")
    result = analyse(options.logs, options.epoch)
    for line in summary(result, options.logs, options.epoch):
        print("check_samples: " + line)
    for error in result.errors:
        print("check_samples: FAIL: " + error)
    if result.ok:
        print("check_samples: epoch %d: each of the %d samples seen exactly once" % (options.epoch, result.dataset_size))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
