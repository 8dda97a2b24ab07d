"""PyTorch's own DistributedDataParallel, measured the way `dtrain bench ddp`
measures dtrain's, so that bench/ddp.sh can put the two side by side.

Same layer shapes as dtrain's models (src/models/mlp.cpp here, the GPT of
gpt.cpp and gpt_block.cpp in common.py), same per-rank batches, one intra-op
thread per rank, the same protocol (warm-up steps, then rounds in which the
modes take turns, median of each step's slowest rank). PyTorch's DDP runs
with its default options on gloo, the CPU backend PyTorch users get.

    torchrun --standalone --nproc-per-node 2 bench/peers/ddp_peer.py --model all --json out.json
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from common import GPT, start_peer, timed_round  # bench/peers/common.py

# Keep in step with apps/dtrain/bench_ddp.cpp (bench/ddp_compare.py checks
# that parameter counts and batches agree).
MLP_HIDDEN = (2048, 2048)
MLP_BATCH = 8
MLP_STEPS = 20
GPT_CONFIG = dict(vocab_size=256, seq_len=128, n_layer=6, n_embd=512, n_head=8)
GPT_BATCH = 4
GPT_STEPS = 4
LEARNING_RATE = 1e-3

# No ddp-bf16 here: dtrain's bf16 hook and PyTorch's bf16_compress_hook
# round differently, and the comparison the issue asks for is plain DDP.
MODES = ("ideal", "naive", "ddp")


class MLP(nn.Module):
    """dtrain::models::MLP: Flatten -> [Linear -> ReLU] per hidden size -> Linear(10)."""

    def __init__(self, hidden_sizes):
        super().__init__()
        layers, width = [nn.Flatten()], 28 * 28
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, 10))
        self.layers = nn.Sequential(*layers)

    def forward(self, images):
        return self.layers(images)


class Replica:
    """One mode's own model: DDP's hooks stay on the parameters it wraps."""

    def __init__(self, mode, make_model):
        torch.manual_seed(0)  # every mode starts from the same weights
        self.mode = mode
        self.model = make_model()
        self.forward = DistributedDataParallel(self.model) if mode == "ddp" else self.model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LEARNING_RATE)
        self.step_seconds = []


def train_step(replica, batch):
    inputs, targets = batch
    start = time.perf_counter()
    output = replica.forward(inputs)
    loss = F.cross_entropy(output.flatten(0, -2), targets.flatten())
    loss.backward()
    if replica.mode == "naive":
        for parameter in replica.model.parameters():
            dist.all_reduce(parameter.grad, op=dist.ReduceOp.AVG)
    replica.optimizer.step()
    replica.optimizer.zero_grad()
    return time.perf_counter() - start


def bench_model(name, make_model, batch, steps, args):
    replicas = [Replica(mode, make_model) for mode in MODES]
    model = replicas[0].model
    parameters = sum(p.numel() for p in model.parameters())  # a tied weight is one parameter here too
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for replica in replicas:
        for _ in range(args.warmup):
            train_step(replica, batch)
    for _ in range(args.rounds):
        for replica in replicas:
            replica.step_seconds += timed_round(lambda: train_step(replica, batch), steps)

    ideal = statistics.median_high(replicas[0].step_seconds)
    results = []
    for replica in replicas:
        # median_high: the same element dtrain's median (sorted[n/2]) picks.
        step = statistics.median_high(replica.step_seconds)
        results.append(dict(model=name, parameters=parameters, batch_per_rank=batch[0].size(0), steps_per_round=steps,
                            mode=replica.mode, step_s=step, ratio_to_ideal=step / ideal, exposed_comm_s=None,
                            # PyTorch's plain all-reduce DDP sends every gradient once, like naive.
                            bytes_sent_per_step=0 if replica.mode == "ideal" else gradient_bytes,
                            step_s_samples=replica.step_seconds))
    return results


def print_results(results):
    first = results[0]
    print(f"\n{first['model']}: {first['parameters'] / 1e6:.2f}M parameters, per-rank batch {first['batch_per_rank']}, "
          f"median of {len(first['step_s_samples']) // first['steps_per_round']} rounds x {first['steps_per_round']} steps")
    print(f"{'mode':<10} {'step ms':>14} {'/ ideal':>9} {'MiB sent/step':>14}")
    for r in results:
        print(f"{r['mode']:<10} {r['step_s'] * 1e3:14.2f} {r['ratio_to_ideal']:9.3f} {r['bytes_sent_per_step'] / 2**20:14.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("mlp", "gpt", "all"), default="all")
    parser.add_argument("--steps", type=int, default=0, help="timed steps per mode per round (0: mlp 20, gpt 4)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", help="also write the results as JSON to this path")
    args = parser.parse_args()

    rank = start_peer("DDP", "SGD")

    results = []
    torch.manual_seed(1 + rank)  # each rank its own samples
    if args.model in ("mlp", "all"):
        batch = (torch.randn(MLP_BATCH, 1, 28, 28), torch.randint(0, 10, (MLP_BATCH,)))
        results_mlp = bench_model("mlp", lambda: MLP(MLP_HIDDEN), batch, args.steps or MLP_STEPS, args)
        if rank == 0:
            print_results(results_mlp)
        results += results_mlp
    if args.model in ("gpt", "all"):
        vocab, seq_len = GPT_CONFIG["vocab_size"], GPT_CONFIG["seq_len"]
        batch = (torch.randint(0, vocab, (GPT_BATCH, seq_len)), torch.randint(0, vocab, (GPT_BATCH, seq_len)))
        results_gpt = bench_model("gpt", lambda: GPT(**GPT_CONFIG), batch, args.steps or GPT_STEPS, args)
        if rank == 0:
            print_results(results_gpt)
        results += results_gpt

    if rank == 0 and args.json:
        document = dict(implementation="pytorch", torch_version=torch.__version__, nproc=dist.get_world_size(),
                        backend="gloo", threads_per_rank=torch.get_num_threads(), rounds=args.rounds,
                        warmup=args.warmup, results=results)
        partial = args.json + ".partial"  # renamed into place: a reader never sees half a file
        with open(partial, "w") as out:
            json.dump(document, out, indent=2)
            out.write("\n")
        os.replace(partial, args.json)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
