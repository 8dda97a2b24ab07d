#!/usr/bin/env python3
"""`dtrain trace summary` on traces a test run wrote: exits 0, prints a row per
rank in its table, and its --json form agrees with the definitions in
include/dtrain/trace_summary.h (Note [trace summary]).

    check_summary_cli.py [--ranks N] DTRAIN TRACE.json [TRACE.json ...]
      (N: the ranks each trace must list, 0..N-1; 2 by default)
"""

import json
import re
import subprocess
import sys


def run(command):
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    print("$", " ".join(command), "->", result.returncode)
    print(result.stdout, result.stderr, sep="")
    if result.returncode != 0:
        sys.exit(f"FAIL: exit code {result.returncode}")
    return result.stdout


def check(dtrain, path, nranks):
    table = run([dtrain, "trace", "summary", path])
    rows = [line.split()[0] for line in table.splitlines()[1:] if line.strip()]
    if rows != [str(r) for r in range(nranks)]:
        sys.exit(f"FAIL: expected table rows for ranks 0..{nranks - 1}, got {rows}")
    if not re.search(r"overlap", table.splitlines()[0]):
        sys.exit("FAIL: the table header has no overlap column")

    summary = json.loads(run([dtrain, "trace", "summary", "--json", path]))
    ranks = summary["ranks"]
    if [r["rank"] for r in ranks] != list(range(nranks)):
        sys.exit(f"FAIL: --json lists ranks {[r['rank'] for r in ranks]}, expected {list(range(nranks))}")
    for r in ranks:
        parts = r["compute_ms"] + r["exposed_comm_ms"] + r["other_ms"]
        if abs(parts - r["wall_ms"]) > 1e-6 * r["wall_ms"]:
            sys.exit(f"FAIL: rank {r['rank']}: compute + exposed + other = {parts} != wall {r['wall_ms']}")
        if not 0 <= r["overlap"] <= 1 or r["exposed_comm_ms"] > r["comm_ms"]:
            sys.exit(f"FAIL: rank {r['rank']}: overlap {r['overlap']}, exposed {r['exposed_comm_ms']} "
                     f"> comm {r['comm_ms']}?")


def main():
    args = sys.argv[1:]
    nranks = 2
    if args[:1] == ["--ranks"]:
        nranks, args = int(args[1]), args[2:]
    dtrain, paths = args[0], args[1:]
    for path in paths:
        check(dtrain, path, nranks)
    print("PASS")


if __name__ == "__main__":
    main()
