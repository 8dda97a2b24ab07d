#!/usr/bin/env python3
"""`dtrain plan --search` against measured step times (issue 40).

Measures the link once (`dtrain bench collectives --nproc N --json`, its
fitted alpha-beta links; or takes --link LATENCY_US,GB_PER_S or an earlier
such file), then for each model of --models runs

    dtrain plan --search --json --top K --nproc N --link LINKS MODEL_FLAGS

and trains every listed layout, one after the other in this run, with

    dtrain train MODEL_FLAGS TRAIN_FLAGS --nproc N --steps S --samples 0 --log-every 1 --metrics PATH

(env DTRAIN_TIMEOUT=120 unless set). A layout's measured step time is the
median of its steps after the first --warmup (the final metrics line's
step_time_s_median, the median of every step, is kept beside it); with
--rounds R the layouts take turns R times and the median over the rounds
counts. A run that fails is recorded with its stderr's tail and left out of
the statistics.

Per model it reports, against the goals of issue 40:

- Kendall's tau-b between predicted and measured step time (goal >= 0.7);
- how far the predicted best (the search's row 1; the first row measured if
  row 1 failed) is from the fastest measured: measured(best) / fastest - 1
  (goal <= 5%);
- the median of |predicted - measured| / measured (goal <= 15%).

The binary is copied to a private folder first (the build may be replaced
while this runs). Results go to --out (default bench/results/plan_search.json)
with the date, the commit, the command line and the links used.

    bench/plan_search.py [--models mlp,gpt,llama] [--top 10] [--steps 8] [--warmup 2] [--rounds 1]
                         [--nproc 4] [--link LINKS] [--link-max-bytes B] [--out PATH] [DTRAIN]
"""

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODELS = {
    "mlp": ["--model", "mlp", "--batch-size", "512"],
    "gpt": ["--model", "gpt", "--gpt-layers", "6", "--gpt-dim", "512", "--gpt-heads", "8", "--seq-len", "128",
            "--batch-size", "16"],
    "llama": ["--model", "llama", "--gpt-layers", "8", "--gpt-dim", "512", "--gpt-heads", "8", "--seq-len", "128",
              "--batch-size", "16"],
}

GOALS = {"kendall_tau_b": 0.7, "best_gap": 0.05, "median_abs_rel_error": 0.15}


def kendall_tau_b(xs, ys):
    """Kendall's tau-b of two equally long sequences (ties in either counted as in tau-b); None if undefined."""
    n = len(xs)
    concordant = discordant = tied_x = tied_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx = (xs[i] > xs[j]) - (xs[i] < xs[j])
            dy = (ys[i] > ys[j]) - (ys[i] < ys[j])
            if dx == 0:
                tied_x += 1
            if dy == 0:
                tied_y += 1
            if dx * dy > 0:
                concordant += 1
            elif dx * dy < 0:
                discordant += 1
    pairs = n * (n - 1) // 2
    denominator = math.sqrt((pairs - tied_x) * (pairs - tied_y))
    return (concordant - discordant) / denominator if denominator > 0 else None


def command_text(command):
    return " ".join(command)


def session_members(session):
    """The ids of the processes in session `session` (the ranks put themselves in groups of their own)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session:
                members.append(int(entry))
    return members


def stop_session(process):
    """Stops a timed-out run: SIGTERM to the launcher (it stops its ranks), then SIGKILL to whatever of
    its session is left after 10 s."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    deadline = time.time() + 10
    while session_members(process.pid) and time.time() < deadline:
        time.sleep(0.2)
    for pid in session_members(process.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_quiet(command, folder, name, timeout, env):
    """Runs `command` in its own process group with stdout and stderr to files;
    returns (exit status or None on timeout, stderr tail)."""
    stdout_path, stderr_path = os.path.join(folder, name + ".out"), os.path.join(folder, name + ".err")
    with open(stdout_path, "w") as out, open(stderr_path, "w") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                   start_new_session=True)
        try:
            status = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_session(process)
            status = None
    with open(stderr_path, errors="replace") as f:
        tail = f.read()[-2000:]
    if not tail.strip():
        with open(stdout_path, errors="replace") as f:
            tail = f.read()[-2000:]
    return status, tail


def last_lines(text, count=2):
    """The last `count` non-empty lines of `text`, joined with ' | '."""
    return " | ".join([line.strip() for line in text.splitlines() if line.strip()][-count:])


def measure_links(dtrain, nproc, max_bytes, folder, env):
    path = os.path.join(folder, "links.json")
    command = [dtrain, "bench", "collectives", "--nproc", str(nproc), "--max-bytes", str(max_bytes), "--json", path]
    print("running: " + command_text(command), flush=True)
    status, tail = run_quiet(command, folder, "collectives", 1200, env)
    if status != 0:
        sys.exit(f"dtrain bench collectives failed ({status}):\n{tail}")
    return path, command


def plan_json(dtrain, args):
    command = [dtrain, "plan"] + args + ["--json"]
    print("running: " + command_text(command), flush=True)
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


def train(dtrain, model_flags, layout_flags, nproc, steps, warmup, metrics, folder, name, timeout, env):
    command = ([dtrain, "train"] + model_flags + layout_flags +
               ["--nproc", str(nproc), "--steps", str(steps), "--samples", "0", "--log-every", "1",
                "--metrics", metrics])
    print("running: " + command_text(command), flush=True)
    start = time.time()
    status, tail = run_quiet(command, folder, name, timeout, env)
    result = {"command": command_text(command), "seconds": time.time() - start}
    records = []
    if status == 0:
        try:
            with open(metrics) as f:
                records = [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError) as e:
            tail += f"\n(metrics unreadable: {e})"
    final = records[-1] if records and records[-1].get("final") else None
    if status != 0 or final is None:
        result["error"] = ("timed out after %d s" % timeout if status is None else f"exit status {status}") + \
            ("" if status != 0 else ", no final metrics line")
        result["stderr_tail"] = tail
        print(f"  FAILED ({result['error']}): {last_lines(tail)}", flush=True)
        return result
    step_times = [r["step_time_s"] for r in records if "step_time_s" in r and not r.get("final")]
    counted = step_times[warmup:] or step_times
    result.update({"step_times_s": step_times, "step_time_s": statistics.median(counted),
                   "final_step_time_s_median": final.get("step_time_s_median"),
                   "peak_bytes_per_rank": final.get("peak_memory_bytes_per_rank"), "mesh": final.get("mesh")})
    print(f"  median step after {warmup} warm-up: {result['step_time_s'] * 1e3:.2f} ms", flush=True)
    return result


def summarize(rows):
    """The statistics over the rows that ran (in the search's order)."""
    ran = [r for r in rows if r.get("measured_s") is not None]
    out = {"layouts": len(rows), "measured": len(ran), "failed": len(rows) - len(ran),
           "kendall_tau_b": None, "best_gap": None, "predicted_best_rank": None, "fastest_rank": None,
           "median_abs_rel_error": None}
    if not ran:
        return out
    out["kendall_tau_b"] = kendall_tau_b([r["predicted_s"] for r in ran], [r["measured_s"] for r in ran]) \
        if len(ran) > 1 else None
    best, fastest = ran[0], min(ran, key=lambda r: r["measured_s"])
    out.update({"predicted_best_rank": best["rank"], "fastest_rank": fastest["rank"],
                "best_gap": best["measured_s"] / fastest["measured_s"] - 1,
                "median_abs_rel_error": statistics.median(
                    abs(r["predicted_s"] - r["measured_s"]) / r["measured_s"] for r in ran)})
    out["meets"] = {
        "kendall_tau_b": out["kendall_tau_b"] is not None and out["kendall_tau_b"] >= GOALS["kendall_tau_b"],
        "best_gap": out["best_gap"] <= GOALS["best_gap"],
        "median_abs_rel_error": out["median_abs_rel_error"] <= GOALS["median_abs_rel_error"]}
    return out


def print_model(name, entry):
    print(f"\n### {name} ({entry['parameters'] / 1e6:.2f}M parameters; {' '.join(entry['model_flags'])}; "
          f"search: {entry['search']['candidates']} candidates, {entry['search']['refused']} refused, "
          f"{entry['search']['over_memory']} over memory)\n")
    print("| rank | flags | predicted ms | measured ms | measured / predicted |")
    print("|---:|---|---:|---:|---:|")
    for r in entry["rows"]:
        flags = " ".join(r["train_flags"]) or "(defaults)"
        if r.get("measured_s") is None:
            measured, ratio = "failed", "-"
        else:
            measured, ratio = f"{r['measured_s'] * 1e3:.2f}", f"{r['measured_s'] / r['predicted_s']:.3f}"
        print(f"| {r['rank']} | `{flags}` | {r['predicted_s'] * 1e3:.2f} | {measured} | {ratio} |")
    s = entry["summary"]

    def verdict(key):
        return "" if "meets" not in s else ("  (meets)" if s["meets"][key] else "  (misses)")

    print(f"\n{name}: {s['measured']} of {s['layouts']} layouts measured, {s['failed']} failed")
    if s["kendall_tau_b"] is None:
        print(f"{name}: Kendall tau-b undefined (under 2 layouts measured, or every predicted or every measured "
              f"time equal) (goal >= {GOALS['kendall_tau_b']})  (misses)")
    else:
        print(f"{name}: Kendall tau-b {s['kendall_tau_b']:.3f} (goal >= {GOALS['kendall_tau_b']}){verdict('kendall_tau_b')}")
    if s["best_gap"] is not None:
        print(f"{name}: predicted best (rank {s['predicted_best_rank']}) is {s['best_gap'] * 100:.1f}% slower than the "
              f"fastest measured (rank {s['fastest_rank']}) (goal <= {GOALS['best_gap'] * 100:.0f}%){verdict('best_gap')}")
        print(f"{name}: median |predicted - measured| / measured {s['median_abs_rel_error'] * 100:.1f}% "
              f"(goal <= {GOALS['median_abs_rel_error'] * 100:.0f}%){verdict('median_abs_rel_error')}")
    for r in entry["rows"]:
        if r.get("measured_s") is None:
            failed = next(run for run in r["runs"] if "error" in run)
            print(f"{name}: rank {r['rank']} failed ({failed['error']}): {last_lines(failed['stderr_tail'])}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dtrain", nargs="?", default=os.path.join(REPO, "build/bin/dtrain"))
    parser.add_argument("--models", default="mlp,gpt,llama", help="comma-separated, of " + ",".join(MODELS))
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--spread", action="store_true",
                        help="measure --top layouts spread evenly over the whole ranking instead of the first ones "
                             "(how well the model orders layouts that differ, not only the near-ties at the top)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the median")
    parser.add_argument("--rounds", type=int, default=1, help="times each layout runs, taking turns")
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--link", help="LATENCY_US,GB_PER_S or a `dtrain bench collectives --json` file "
                                       "(default: measure it now)")
    parser.add_argument("--link-max-bytes", type=int, default=16 << 20,
                        help="largest message of the link measurement (default 16 MiB)")
    parser.add_argument("--run-timeout", type=int, default=900, help="seconds one dtrain train run may take")
    parser.add_argument("--out", default=os.path.join(REPO, "bench/results/plan_search.json"))
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            parser.error(f"unknown model {m!r} (known: {', '.join(MODELS)})")

    env = dict(os.environ)
    env.setdefault("DTRAIN_TIMEOUT", "120")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    start, load_before = time.time(), os.getloadavg()[0]
    record = {"benchmark": "plan_search", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "commit": commit, "command": " ".join([sys.argv[0]] + sys.argv[1:]), "nproc": args.nproc,
              "top": args.top, "spread": args.spread, "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
              "cores": os.cpu_count(), "goals": GOALS, "models": {}}
    with tempfile.TemporaryDirectory(prefix="plan_search-") as folder:
        dtrain = os.path.join(folder, "dtrain")
        shutil.copy2(args.dtrain, dtrain)
        if args.link:
            link = args.link
            record["link"] = {"given": args.link}
        else:
            link, link_command = measure_links(dtrain, args.nproc, args.link_max_bytes, folder, env)
            record["link"] = {"measured_by": command_text(link_command).replace(dtrain, "dtrain")}
        if os.path.isfile(link):
            with open(link) as f:
                links = json.load(f)
            record["link"].update({"links": links.get("links"), "threads_per_rank": links.get("threads_per_rank")})
            for fit in links.get("links", []):
                print(f"link {fit['op']}: {fit['latency_seconds'] * 1e6:.2f} us, "
                      f"{fit['bytes_per_second'] / 1e9:.3f} GB/s", flush=True)

        for name in models:
            search = plan_json(dtrain, ["--search", "--top", "0" if args.spread else str(args.top), "--nproc",
                                        str(args.nproc), "--link", link] + MODELS[name])
            if args.spread:  # --top layouts evenly apart over the whole ranking, its first and last included
                listed = search["layouts"]
                picks = sorted({round(i * (len(listed) - 1) / max(1, args.top - 1)) for i in range(args.top)})
                search["layouts"] = [listed[i] for i in picks]
                search["ranks"] = [i + 1 for i in picks]
            model_flags = search["model_flags"]
            parameters = plan_json(dtrain, model_flags + ["--nproc", str(args.nproc)])["parameters"]
            print(f"{name}: {parameters} parameters ({parameters / 1e6:.2f}M); {len(search['layouts'])} layouts listed "
                  f"of {search['candidates']} candidates", flush=True)
            ranks = search.get("ranks") or list(range(1, len(search["layouts"]) + 1))
            rows = [{"rank": ranks[i], "train_flags": layout["train_flags"], "predicted_s": layout["step_seconds"],
                     "predicted": {k: v for k, v in layout.items() if k != "train_flags"}, "runs": []}
                    for i, layout in enumerate(search["layouts"])]
            for round_index in range(args.rounds):
                for row in rows:
                    tag = f"{name}-{row['rank']}-{round_index}"
                    row["runs"].append(train(dtrain, model_flags, row["train_flags"], args.nproc, args.steps,
                                             args.warmup, os.path.join(folder, tag + ".jsonl"), folder, tag,
                                             args.run_timeout, env))
            for row in rows:
                times = [run["step_time_s"] for run in row["runs"] if "step_time_s" in run]
                # A layout that failed in any round is left out: its rounds are not comparable with the others'.
                row["measured_s"] = statistics.median(times) if len(times) == len(row["runs"]) else None
                for run in row["runs"]:
                    run["command"] = run["command"].replace(dtrain, "dtrain")
            entry = {"model_flags": model_flags, "parameters": parameters,
                     "search": {k: search.get(k) for k in ("candidates", "refused", "over_memory",
                                                           "memory_limit_bytes", "search_seconds")},
                     "rows": rows}
            entry["summary"] = summarize(rows)
            record["models"][name] = entry
            print_model(name, entry)

    record.update({"seconds": time.time() - start, "load_average_before": load_before,
                   "load_average_after": os.getloadavg()[0]})
    print("\n## summary\n")
    print("| model | parameters | measured / listed | Kendall tau-b (>= 0.7) | predicted best vs fastest (<= 5%) "
          "| median abs. error (<= 15%) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, entry in record["models"].items():
        s = entry["summary"]

        def cell(key, text):
            return "-" if s[key] is None else text + (" ok" if s.get("meets", {}).get(key) else " miss")

        print(f"| {name} | {entry['parameters'] / 1e6:.2f}M | {s['measured']} / {s['layouts']} | "
              f"{cell('kendall_tau_b', '%.3f' % (s['kendall_tau_b'] or 0))} | "
              f"{cell('best_gap', '%+.1f%%' % ((s['best_gap'] or 0) * 100))} | "
              f"{cell('median_abs_rel_error', '%.1f%%' % ((s['median_abs_rel_error'] or 0) * 100))} |")
    print(f"\n{time.time() - start:.0f} s; load average {load_before:.2f} before, {record['load_average_after']:.2f} after")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
