#!/usr/bin/env python3
"""Fails when a file of src/ includes a layer above its own (docs/architecture.md, "Layers").

    check_layers.py [REPO]

Every directory of src/ is a layer; a public header (include/dtrain/X.h)
belongs to the layer that implements it. A file may include its own layer and
the layers of a lower level (LEVEL). The known back-edges that remain (issue 17, item 5) are
listed in KNOWN with the reason and the way out; a new one fails, and one of
KNOWN that is gone must be taken off the list (so the list stays true).
"""
import os
import re
import sys

# Each layer's level, bottom up. A layer may include only layers of a lower
# level: siblings (the three engines; comm, models and data; trace, tp, pp and cp) do not see each other.
LEVEL = {
    "common": 0,
    "comm": 1, "models": 1, "data": 1,
    "trace": 2, "tp": 2, "pp": 2, "cp": 2,
    "ddp": 3, "fsdp": 3, "ps": 3,
    "checkpoint": 4, "plan": 4,
    "train": 5,
}

# Which layer implements each public header.
OWNER = {
    "sharding.h": "common", "fsdp_compression.h": "common", "strategy_table.h": "common", "memory.h": "common",
    "shard_range.h": "common", "flat_runs.h": "common",
    "comm.h": "comm", "grad_norm.h": "comm", "join.h": "comm", "trace.h": "common", "trace_writer.h": "trace", "trace_summary.h": "trace",
    "models.h": "models", "llama.h": "models", "deferred_init.h": "models", "attention.h": "models", "float8.h": "models", "sampling.h": "models", "data.h": "data", "tokenizer.h": "data",
    "mesh.h": "comm", "stand_in_group.h": "comm", "tensor_parallel.h": "tp", "tp_gpt.h": "tp", "tp_gpt_stage.h": "tp", "tp_llama.h": "tp", "pipeline.h": "pp", "context_parallel.h": "cp", "gpt_stage.h": "models",
    "ddp.h": "ddp", "comm_hooks.h": "ddp", "sync_batch_norm.h": "ddp",
    "fsdp.h": "fsdp", "ps.h": "ps",
    "checkpoint.h": "checkpoint", "checkpoint_manifest.h": "checkpoint", "hugging_face.h": "checkpoint", "safetensors.h": "checkpoint",
    "plan.h": "plan", "train.h": "train", "model_spec.h": "train", "trainer.h": "train",
}

# (from layer, to layer): why it is still there and how it goes away.
KNOWN = {}  # none left: the last (comm -> trace) went when the trace writer moved apart from the recorder

INCLUDE = re.compile(r'#include [<"]([a-z_]+)/([^">]+)[">]')


def layer_of_include(top, rest):
    if top == "dtrain":
        return OWNER.get(rest)
    return top if top in LEVEL else None


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    src = os.path.join(repo, "src")
    found = {}
    unknown_headers = set()
    for root, _, files in os.walk(src):
        for name in sorted(files):
            if not name.endswith((".cpp", ".h")):
                continue
            path = os.path.join(root, name)
            layer = os.path.relpath(path, src).split(os.sep)[0]
            if layer not in LEVEL:
                sys.exit(f"check_layers: {path}: src/{layer}/ is no layer of LEVEL in {__file__}: add it")
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    if m.group(1) == "dtrain" and m.group(2) not in OWNER:
                        unknown_headers.add(m.group(2))
                    target = layer_of_include(m.group(1), m.group(2))
                    if target and target != layer and LEVEL[target] >= LEVEL[layer]:
                        found.setdefault((layer, target), []).append(f"{os.path.relpath(path, repo)}:{number}")
    problems = []
    for header in sorted(unknown_headers):
        problems.append(f"include/dtrain/{header} has no layer in OWNER ({__file__})")
    for edge, places in sorted(found.items()):
        if edge not in KNOWN:
            problems.append(f"src/{edge[0]}/ includes src/{edge[1]}/, a layer above it or beside it: {', '.join(places)}")
    for edge in sorted(KNOWN):
        if edge not in found:
            problems.append(f"the known back-edge {edge[0]} -> {edge[1]} is gone: take it off KNOWN")
    for edge in sorted(set(found) & set(KNOWN)):
        print(f"known back-edge {edge[0]} -> {edge[1]} ({len(found[edge])} includes): {KNOWN[edge]}")
    if problems:
        print("\n".join("check_layers: " + p for p in problems), file=sys.stderr)
        sys.exit(1)
    print(f"check_layers: no new back-edge among {len(LEVEL)} layers")


if __name__ == "__main__":
    main()
