"""Draws the benchmark plots of docs/PERFORMANCE.md from bench/results/*.json.

    python3 bench/plot.py [--results DIR] [--out DIR] [--keep]

Writes, with gnuplot (pngcairo, else png), 900x600 PNGs:
  bus_bandwidth.png  bus bandwidth against message size per collective, dtrain
                     next to the raw backend call (collectives-mpi-np2.json,
                     plus collectives-c10d-np2.json when present)
  step_time.png      step time against world size per strategy
  peak_memory.png    peak memory per rank against world size per strategy,
                     measured next to `dtrain plan`'s prediction
                     (both from fsdp-dtrain.json's "memory" part)

A plot whose JSON is missing is skipped with a note; malformed JSON is an
error naming the file and field (the other plots are still drawn, the exit
status is 1). Standard library only, so it runs from a clean clone.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from bench_results import InputError, collective_rows, human_bytes, load_results, memory_rows

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIDTH, HEIGHT = 900, 600
OPS = ("all_reduce", "all_gather", "reduce_scatter")
STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")
# One colour per strategy, kept across the two world-size plots.
STRATEGY_COLOURS = {"ddp": "#1f77b4", "zero1": "#ff7f0e", "zero2": "#2ca02c", "fsdp": "#d62728"}


# ---------------------------------------------------------------- gnuplot


def gnuplot(args):
    """Runs gnuplot, bounded: a plot of a few dozen points takes well under a second."""
    try:
        return subprocess.run(["gnuplot"] + args, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise InputError("gnuplot %s ran over 120 s; rerun with --keep and run the script by hand" % " ".join(args))


def pick_terminal():
    """pngcairo when this gnuplot has it (antialiased), else the libgd png terminal."""
    if shutil.which("gnuplot") is None:
        raise InputError("gnuplot is not installed; run scripts/setup (Debian package gnuplot-nox)")
    for terminal, options in (("pngcairo", 'enhanced font "DejaVu Sans,11"'), ("png", 'enhanced font "DejaVuSans,11"')):
        probe = gnuplot(["-e", "set terminal %s" % terminal])
        if probe.returncode == 0 and not probe.stderr.strip():
            return "set terminal %s size %d,%d %s" % (terminal, WIDTH, HEIGHT, options)
    raise InputError("this gnuplot has neither the pngcairo nor the png terminal; install gnuplot-nox (scripts/setup)")


def quote(text):
    """A gnuplot double-quoted string (enhanced text: '_' would subscript)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("_", "\\\\_")
    return '"%s"' % escaped.replace("\n", "\\n")


class Figure:
    """One PNG: data files and a script in a temp dir, then one gnuplot run."""

    def __init__(self, workdir, name, terminal):
        self.workdir, self.name, self.terminal = workdir, name, terminal
        self.lines = []

    def data(self, label, rows):
        path = os.path.join(self.workdir, "%s-%s.dat" % (self.name, label))
        with open(path, "w") as f:
            for row in rows:
                f.write(" ".join("%.9g" % v for v in row) + "\n")
        return '"%s"' % path

    def render(self, out_path):
        script = os.path.join(self.workdir, self.name + ".gp")
        with open(script, "w") as f:
            f.write("%s\nset output %s\n" % (self.terminal, quote_path(out_path)))
            f.write("\n".join(self.lines) + "\nunset output\n")
        run = gnuplot([script])
        # gnuplot exits 0 on some errors inside plot commands but always reports them on stderr.
        if run.returncode != 0 or run.stderr.strip():
            raise InputError("gnuplot failed on %s:\n%s" % (script, run.stderr.strip()))


def quote_path(path):
    return '"%s"' % path.replace("\\", "\\\\").replace('"', '\\"')


def world_size_axis(fig, worlds):
    fig.lines += [
        "set logscale x 2",
        "set xrange [%g:%g]" % (min(worlds) / 1.3, max(worlds) * 1.3),
        "set xtics (%s)" % ", ".join('"%d" %d' % (w, w) for w in sorted(worlds)),
        'set xlabel "world size (ranks)"',
        "set grid",
        "set key top left box opaque",
    ]


def model_title(model):
    batch = ""
    if model.get("batch_per_rank") and model.get("seq_len"):
        batch = ", batch %d x %d tokens per rank" % (model["batch_per_rank"], model["seq_len"])
    cores = model.get("cores") or 2
    return "GPT %d layers x %d wide (%.1fM parameters)%s, AdamW; all ranks share %d cores" % (
        model["n_layer"], model["n_embd"], model["parameters"] / 1e6, batch, cores)


def skipped_note(model, strategies):
    skips = ["%s at %d" % s for s in model["skipped"] if s[0] in strategies]
    return "not run (plan exceeds this machine's memory): " + ", ".join(skips) if skips else ""


# ---------------------------------------------------------------- plots


# (source, which busbw field) -> gnuplot style and key title.
BANDWIDTH_SERIES = (
    ("mpi", "dtrain", 'lw 2 pt 7 lc rgb "#1f77b4"', "dtrain (mpi)"),
    ("mpi", "raw", 'lw 2 dt 2 pt 6 lc rgb "#ff7f0e"', "MPI call made directly (raw)"),
    ("c10d", "dtrain", 'lw 2 pt 5 lc rgb "#2ca02c"', "dtrain (c10d, gloo)"),
    ("c10d", "raw", 'lw 2 dt 2 pt 4 lc rgb "#9467bd"', "gloo called directly (raw)"),
)


def plot_bus_bandwidth(fig, mpi, c10d):
    """One panel per collective, log-log since gloo runs 10-100x below MPI;
    one key for all panels in a strip under them (inside a panel it hides points)."""
    sources = {"mpi": mpi[0], "c10d": c10d[0] if c10d else {}}
    algorithms = mpi[1]
    all_rows = [r for rows in list(sources["mpi"].values()) + list(sources["c10d"].values()) for r in rows]
    sizes = sorted({r[0] for r in all_rows})
    values = [v for r in all_rows for v in r[1:] if v]
    present = set(sources["mpi"]) | set(sources["c10d"])
    ops = [op for op in OPS if op in present] + sorted(op for op in present if op not in OPS)
    ticks = sizes[::2]
    title = "Bus bandwidth, 2 ranks on one host: dtrain vs the backend called directly (fp32, nccl-tests busbw)"
    key_height, title_height, width = 0.07, 0.05, 1.0 / len(ops)
    fig.lines += [
        "set multiplot title %s font \",12\"" % quote(title),
        "set logscale xy",
        "set xrange [%g:%g]" % (sizes[0] / 1.5, sizes[-1] * 1.5),
        "set yrange [%g:%g]" % (min(values) / 1.5, max(values) * 2.5),
        "set xtics (%s) rotate by -45" % ", ".join("%s %d" % (quote(human_bytes(s)), s) for s in ticks),
        'set format y "%g"',
        "set grid",
        'set xlabel "message size (bytes, log scale)"',
        "unset key",
        "set size %g, %g" % (width, 1 - key_height - title_height),
    ]
    drawn = []
    for i, op in enumerate(ops):
        plots = []
        for source, which, style, label in BANDWIDTH_SERIES:
            rows = sources[source].get(op, [])
            points = [(s, dtrain if which == "dtrain" else raw) for s, dtrain, raw in rows]
            points = [p for p in points if p[1] is not None]
            if points:
                data = fig.data("%s-%s-%s" % (source, which, op), points)
                plots.append("%s using 1:2 with linespoints %s" % (data, style))
                drawn += [(style, label)] if (style, label) not in drawn else []
        fig.lines += [
            "set origin %g, %g" % (i * width, key_height),
            "set title %s" % quote("%s\n(%s)" % (op, algorithms[op]) if op in algorithms else op),
            'set ylabel "bus bandwidth (GB/s, log scale)"' if i == 0 else "unset ylabel",
            "plot " + ", \\\n     ".join(plots),
        ]
    # The key strip: the same styles on an empty, borderless plot.
    fig.lines += [
        "set origin 0, 0", "set size 1, %g" % key_height,
        "unset border", "unset tics", "unset grid", "unset title", "unset xlabel", "unset ylabel",
        "set lmargin 0", "set rmargin 0", "set key center center horizontal Left reverse width -3 samplen 3 box",
        "plot " + ", \\\n     ".join("NaN with linespoints %s title %s" % (s, quote(label)) for s, label in drawn),
        "unset multiplot",
    ]


def plot_step_time(fig, model, per_strategy):
    strategies = [s for s in STRATEGIES if s in per_strategy] + sorted(s for s in per_strategy if s not in STRATEGIES)
    worlds = {r[0] for rows in per_strategy.values() for r in rows}
    world_size_axis(fig, worlds)
    fig.lines += [
        "set title %s" % quote("Step time per strategy (median step, slowest rank)\n" + model_title(model)),
        'set ylabel "step time (s)"',
        "set yrange [0:*]",
    ]
    # Each rank keeps its batch, so the work per step grows with the ranks on the same 2 cores.
    notes = ["each rank adds its own batch: the cores do world-size x the work per step"]
    notes += [skipped_note(model, strategies)] if skipped_note(model, strategies) else []
    fig.lines.append("set label 1 %s at graph 0.98, graph 0.06 right font \",9\"" % quote("\n".join(notes)))
    plots = []
    for s in strategies:
        d = fig.data("step-" + s, [(w, step) for w, step, _, _ in per_strategy[s]])
        plots.append("%s using 1:2 with linespoints lw 2 pt 7 lc rgb \"%s\" title %s"
                     % (d, STRATEGY_COLOURS.get(s, "black"), quote(s)))
    fig.lines.append("plot " + ", \\\n     ".join(plots))


def plot_peak_memory(fig, model, per_strategy):
    strategies = [s for s in STRATEGIES if s in per_strategy] + sorted(s for s in per_strategy if s not in STRATEGIES)
    worlds = {r[0] for rows in per_strategy.values() for r in rows}
    world_size_axis(fig, worlds)
    fig.lines += [
        "set title %s" % quote("Peak memory per rank: measured (wide, pale) vs dtrain plan (dashed)\n"
                               + model_title(model)),
        'set ylabel "peak memory per rank (MiB)"',
        "set yrange [0:*]",
        "set key top right box opaque",
    ]
    ratios = [measured / predicted for rows in per_strategy.values() for _, _, measured, predicted in rows]
    notes = ["measured / plan: %.3f to %.3f" % (min(ratios), max(ratios))]
    notes += [skipped_note(model, strategies)] if skipped_note(model, strategies) else []
    fig.lines.append("set label 1 %s at graph 0.02, graph 0.06 left font \",9\"" % quote("\n".join(notes)))
    plots = []
    for s in strategies:
        colour = STRATEGY_COLOURS.get(s, "#000000")
        d = fig.data("memory-" + s, [(w, measured, predicted) for w, _, measured, predicted in per_strategy[s]])
        # The two agree to a fraction of a percent: the measured line is drawn
        # wide and translucent (#AARRGGBB) so the dashed plan stays visible on it.
        plots.append("%s using 1:2 with linespoints lw 7 pt 7 ps 1.6 lc rgb \"#99%s\" title %s"
                     % (d, colour[1:], quote(s + " measured")))
        plots.append("%s using 1:3 with linespoints lw 2 dt 2 pt 6 ps 1.6 lc rgb \"%s\" title %s"
                     % (d, colour, quote(s + " plan")))
    fig.lines.append("plot " + ", \\\n     ".join(plots))


# ---------------------------------------------------------------- main


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=os.path.join(REPO, "bench", "results"), help="where the JSON is")
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "img"), help="where the PNGs go")
    parser.add_argument("--keep", action="store_true", help="keep the gnuplot scripts and data (prints the dir)")
    args = parser.parse_args()

    errors, written = [], []
    try:
        terminal = pick_terminal()
    except InputError as e:
        sys.exit("plot.py: %s" % e)
    os.makedirs(args.out, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="dtrain-plots-")

    def draw(name, plot, *inputs):
        fig = Figure(workdir, name, terminal)
        plot(fig, *inputs)
        out = os.path.join(args.out, name + ".png")
        fig.render(out)
        written.append(out)

    # Collectives.
    try:
        mpi_path = os.path.join(args.results, "collectives-mpi-np2.json")
        c10d_path = os.path.join(args.results, "collectives-c10d-np2.json")
        mpi, c10d = load_results(mpi_path), load_results(c10d_path)
        if mpi is None:
            print("plot.py: skipping bus_bandwidth.png: no %s (make bench writes it)" % mpi_path)
        else:
            mpi = collective_rows(mpi, mpi_path)
            c10d = collective_rows(c10d, c10d_path) if c10d is not None else None
            if c10d is None:
                print("plot.py: bus_bandwidth.png without c10d: no %s" % c10d_path)
            draw("bus_bandwidth", plot_bus_bandwidth, mpi, c10d)
    except InputError as e:
        errors.append(str(e))

    # FSDP memory part: step time and peak memory.
    try:
        fsdp_path = os.path.join(args.results, "fsdp-dtrain.json")
        fsdp = load_results(fsdp_path)
        memory = memory_rows(fsdp, fsdp_path) if fsdp is not None else None
        if memory is None:
            why = "no %s" % fsdp_path if fsdp is None else "%s has no 'memory' part" % fsdp_path
            print("plot.py: skipping step_time.png and peak_memory.png: %s (bench/fsdp.sh writes it)" % why)
        else:
            model, per_strategy = memory
            draw("step_time", plot_step_time, model, per_strategy)
            draw("peak_memory", plot_peak_memory, model, per_strategy)
    except InputError as e:
        errors.append(str(e))

    for out in written:
        print("plot.py: wrote %s (%d KB)" % (os.path.relpath(out), (os.path.getsize(out) + 1023) // 1024))
    if args.keep:
        print("plot.py: gnuplot scripts and data kept in %s" % workdir)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if errors:
        sys.exit("\n".join("plot.py: error: " + e for e in errors))


if __name__ == "__main__":
    main()
