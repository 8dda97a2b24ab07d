#!/usr/bin/env python3
"""dtrain train --tp N / --pp N / --cp N (issues 20, 21 and 39): a run on a
(dp, pp, cp, tp) mesh equals the same run on one process.

    check_mesh.py [--tp T] [--pp P --microbatches M --schedule S [--virtual-stages V]] [--cp C [--cp-overlap off]] --nproc N
                  [--strategy S] [--backend B] [--sequence-parallel] DTRAIN -- TRAIN_ARGS...

Runs TRAIN_ARGS once with --strategy single --nproc 1 (the reference) and once
with --strategy S --nproc N --tp T --pp P --cp C (and the pipeline's and sequence
parallelism's flags, if given), both with --metrics and --log-every 1, and
fails unless: the mesh run exits 0; its final line says mesh
{"dp": N/(T*P*C), "pp": P, "cp": C, "tp": T} and the model's full parameter count; every
step's loss and the final validation loss equal the reference's within 1e-5
(the parallel run sums in another order, as data parallelism does); the
banner names the mesh.
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_dtrain import fail, read_metrics, run, say  # noqa: E402

TOLERANCE = 1e-5


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dtrain")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--microbatches", type=int)
    parser.add_argument("--schedule")
    parser.add_argument("--pp-gather")
    parser.add_argument("--virtual-stages", type=int)
    parser.add_argument("--cp", type=int, default=1)
    parser.add_argument("--cp-overlap")
    parser.add_argument("--nproc", type=int, required=True)
    parser.add_argument("--strategy", default="fsdp")
    parser.add_argument("--backend", default="mpi")
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("train_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    train_args = [a for a in args.train_args if a != "--"]

    with tempfile.TemporaryDirectory() as folder:
        reference_path = os.path.join(folder, "reference.jsonl")
        tp_path = os.path.join(folder, "mesh.jsonl")
        base = [args.dtrain, "train"] + train_args + ["--log-every", "1"]
        run(base + ["--strategy", "single", "--nproc", "1", "--metrics", reference_path])
        pipeline = []
        if args.microbatches:
            pipeline += ["--microbatches", str(args.microbatches)]
        if args.schedule:
            pipeline += ["--schedule", args.schedule]
        if args.pp_gather:
            pipeline += ["--pp-gather", args.pp_gather]
        if args.virtual_stages:
            pipeline += ["--virtual-stages", str(args.virtual_stages)]
        if args.cp > 1:
            pipeline += ["--cp", str(args.cp)]
        if args.cp_overlap:
            pipeline += ["--cp-overlap", args.cp_overlap]
        _, output = run(base + ["--strategy", args.strategy, "--nproc", str(args.nproc), "--tp", str(args.tp),
                             "--pp", str(args.pp), "--backend", args.backend, "--metrics", tp_path] + pipeline
                        + (["--sequence-parallel"] if args.sequence_parallel else []))
        dp = args.nproc // (args.tp * args.pp * args.cp)
        shape = ", ".join([f"dp={dp}"] + [f"{name}={size}" for name, size in (("pp", args.pp), ("cp", args.cp),
                                                                               ("tp", args.tp))
                                          if size > 1])
        if f"mesh ({shape})" not in output:
            fail(f"the banner does not name the mesh ({shape})")

        def losses(records):
            return {r["step"]: r["loss"] for r in records if "loss" in r and "step" in r and not r.get("final")}

        reference, mine = read_metrics(reference_path), read_metrics(tp_path)
        ref_losses, tp_losses = losses(reference), losses(mine)
        if sorted(ref_losses) != sorted(tp_losses):
            fail(f"the runs logged different steps: {sorted(ref_losses)} vs {sorted(tp_losses)}")
        worst = max(abs(ref_losses[s] - tp_losses[s]) for s in ref_losses)
        ref_final, tp_final = reference[-1], mine[-1]
        eval_difference = abs(ref_final["eval_loss"] - tp_final["eval_loss"])
        say(f"{len(ref_losses)} steps: largest |loss difference| {worst:.3g}; validation loss "
            f"{tp_final['eval_loss']:.6f} vs {ref_final['eval_loss']:.6f} (difference {eval_difference:.3g})")
        if worst > TOLERANCE:
            fail(f"a step's loss differs from single-process training by {worst:.3g} > {TOLERANCE}")
        if eval_difference > TOLERANCE:
            fail(f"the validation loss differs by {eval_difference:.3g} > {TOLERANCE}")
        if tp_final.get("mesh") != {"dp": dp, "pp": args.pp, "cp": args.cp, "tp": args.tp}:
            fail(f"the final line's mesh is {tp_final.get('mesh')}, expected dp {dp}, pp {args.pp}, cp {args.cp}, "
                 f"tp {args.tp}")
        if args.virtual_stages and (tp_final.get("pipeline") or {}).get("virtual_stages") != args.virtual_stages:
            fail(f"the final line's pipeline is {tp_final.get('pipeline')}, expected virtual_stages "
                 f"{args.virtual_stages}")
        if tp_final.get("parameters") != ref_final.get("parameters"):
            fail(f"parameters {tp_final.get('parameters')} (the whole model's count, {ref_final.get('parameters')}, "
                 "expected)")
    say("passed")


if __name__ == "__main__":
    main()
