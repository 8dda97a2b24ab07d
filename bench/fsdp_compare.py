"""Puts `dtrain bench fsdp`'s speed part next to bench/peers/fsdp_peer.py.

    python bench/fsdp_compare.py DTRAIN.json PYTORCH.json [--json OUT.json]

Refuses to compare runs whose workloads differ (parameters, batch, ranks).
dtrain's full sharding is compared with PyTorch's FSDP2, and dtrain's DDP
with PyTorch's DDP (the calibration: how the two stacks compare without
sharding). The two runs are minutes apart, not interleaved.
"""
import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dtrain")
    parser.add_argument("pytorch")
    parser.add_argument("--json", help="write the comparison here")
    args = parser.parse_args()
    with open(args.dtrain) as f:
        ours = json.load(f).get("speed")
    with open(args.pytorch) as f:
        theirs = json.load(f)
    if ours is None:
        sys.exit("fsdp_compare: %s has no speed part (run dtrain bench fsdp with --parts speed)" % args.dtrain)
    for key in ("parameters", "batch_per_rank", "seq_len", "world_size"):
        if ours[key] != theirs[key]:
            sys.exit("fsdp_compare: the workloads differ in %s: dtrain %s, pytorch %s" % (key, ours[key], theirs[key]))

    dtrain_rows = {row["mode"]: row for row in ours["rows"]}
    torch_rows = {row["mode"]: row for row in theirs["rows"]}
    pairs = [("ddp", "ddp"), ("fsdp", "fsdp")]
    print("\nGPT %.2fM parameters, %d ranks, per-rank batch %d x %d tokens, AdamW; medians of each step's slowest rank"
          % (ours["parameters"] / 1e6, ours["world_size"], ours["batch_per_rank"], ours["seq_len"]))
    print("%-22s %12s %12s %16s" % ("dtrain / pytorch", "dtrain ms", "pytorch ms", "dtrain/pytorch"))
    rows = []
    for mine, peer in pairs:
        a, b = dtrain_rows[mine]["step_s"], torch_rows[peer]["step_s"]
        label = "fsdp / FSDP2" if mine == "fsdp" else "ddp / DDP"
        print("%-22s %12.1f %12.1f %16.3f" % (label, a * 1e3, b * 1e3, a / b))
        rows.append(dict(dtrain_mode=mine, pytorch_mode=peer, dtrain_step_s=a, pytorch_step_s=b, ratio=a / b))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(dict(workload=dict((k, ours[k]) for k in ("parameters", "batch_per_rank", "seq_len", "world_size")),
                           torch_version=theirs.get("torch_version"), rows=rows), out, indent=2)
            out.write("\n")


if __name__ == "__main__":
    main()
