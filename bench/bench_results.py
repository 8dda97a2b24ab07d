"""Reading bench/results/*.json: shared by bench/plot.py (the PNGs) and
bench/report.py (the tables of docs/PERFORMANCE.md), so both read a result
file the same way and reject a malformed one with the same message.
Standard library only.
"""
import json
import os

MIB = 1024.0 * 1024.0


class InputError(Exception):
    """A results file does not hold what the benchmark writes, or gnuplot failed on it."""


def load_results(path):
    """The parsed JSON, or None when the file does not exist."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise InputError("%s is not valid JSON (%s); rerun the benchmark that writes it (make bench)" % (path, e))


def field(obj, key, where, kinds, nullable=False):
    """obj[key], checked to be one of `kinds`; `where` names obj in the error."""
    if not isinstance(obj, dict):
        raise InputError("%s should be a JSON object, found %s" % (where, type(obj).__name__))
    if key not in obj:
        raise InputError("%s has no '%s'; rerun the benchmark that writes it (make bench)" % (where, key))
    value = obj[key]
    if value is None and nullable:
        return None
    # JSON true/false parse as bool, a subclass of int: never a number here.
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise InputError("%s.%s should be %s, found %r" % (where, key, " or ".join(k.__name__ for k in kinds), value))
    return value


NUMBER = (int, float)


def human_bytes(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return "%d %s" % (n // size, unit)
    return "%d B" % n


def collective_rows(data, path):
    """{op: [(bytes, dtrain GB/s, raw GB/s or None)]}, sorted by size, and the op -> algorithm names."""
    results = field(data, "results", path, (list,))
    if not results:
        raise InputError("%s: 'results' is empty; rerun the benchmark that writes it (make bench)" % path)
    series, algorithms = {}, {}
    for i, row in enumerate(results):
        where = "%s: results[%d]" % (path, i)
        op = field(row, "op", where, (str,))
        size = field(row, "bytes", where, (int,))
        dtrain = field(row, "dtrain_busbw_gbps", where, NUMBER)
        raw = field(row, "raw_busbw_gbps", where, NUMBER, nullable=True)
        algorithms[op] = field(row, "algorithm", where, (str,))
        series.setdefault(op, []).append((size, dtrain, raw))
    for rows in series.values():
        rows.sort()
    return series, algorithms


def memory_rows(data, path):
    """The 'memory' part's model description and, per strategy, rows of
    (world size, slowest rank's median step s, max measured peak MiB, max predicted peak MiB)."""
    memory = data.get("memory") if isinstance(data, dict) else None
    if memory is None:
        return None
    where = path + ": memory"
    model = dict((k, field(memory, k, where, (int,))) for k in ("n_layer", "n_embd", "parameters"))
    # Optional context for the title: shown when present and whole numbers.
    for k, source in (("batch_per_rank", memory), ("seq_len", memory), ("cores", data)):
        model[k] = source.get(k) if type(source.get(k)) is int else None
    model["skipped"] = []
    for i, skip in enumerate(memory.get("skipped") or []):
        w = "%s.skipped[%d]" % (where, i)
        model["skipped"].append((field(skip, "strategy", w, (str,)), field(skip, "world_size", w, (int,))))
    per_strategy = {}
    rows = field(memory, "rows", where, (list,))
    if not rows:
        raise InputError("%s.rows is empty; rerun bench/fsdp.sh" % where)
    for i, row in enumerate(rows):
        w = "%s.rows[%d]" % (where, i)
        strategy = field(row, "strategy", w, (str,))
        world = field(row, "world_size", w, (int,))
        ranks = field(row, "ranks", w, (list,))
        if not ranks:
            raise InputError("%s.ranks is empty; rerun bench/fsdp.sh" % w)
        steps, measured, predicted = [], [], []
        for j, rank in enumerate(ranks):
            rw = "%s.ranks[%d]" % (w, j)
            steps.append(field(rank, "median_step_s", rw, NUMBER))
            measured.append(field(rank, "measured_peak_bytes", rw, NUMBER))
            predicted.append(predicted_total(rank, rw))
        per_strategy.setdefault(strategy, []).append((world, max(steps), max(measured) / MIB, max(predicted) / MIB))
    for rows in per_strategy.values():
        rows.sort()
    return model, per_strategy


def predicted_total(rank, where):
    """`dtrain plan`'s peak: the recorded total, else the sum of its parts."""
    if rank.get("predicted_peak_bytes") is not None:
        return field(rank, "predicted_peak_bytes", where, NUMBER)
    parts = field(rank, "predicted", where, (dict,))
    return sum(field(parts, k, where + ".predicted", NUMBER) for k in parts)
