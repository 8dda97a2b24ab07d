"""PyTorch's own FSDP2 (torch.distributed.fsdp.fully_shard) on the speed
workload of `dtrain bench fsdp`, measured the same way, so that bench/fsdp.sh
can put the two side by side.

Same GPT as dtrain's (common.py's, which mirrors src/models/gpt.cpp and
gpt_block.cpp), the same units (each block, then the root), the same
per-rank batch, AdamW, one intra-op thread per rank, and the same protocol
(warm-up, then rounds in which the modes take turns, median of each step's
slowest rank). PyTorch's DDP runs alongside as a reference. Backend: gloo,
the CPU backend PyTorch users get.

    torchrun --standalone --nproc-per-node 2 bench/peers/fsdp_peer.py --json out.json
"""
import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from common import GPT, start_peer, timed_round  # bench/peers/common.py

# Keep in step with apps/dtrain/bench_fsdp.cpp (speed_config, kSpeedBatch);
# bench/fsdp_compare.py checks that parameter counts and batches agree.
GPT_CONFIG = dict(vocab_size=256, seq_len=128, n_layer=6, n_embd=512, n_head=8)
BATCH = 4
LEARNING_RATE = 1e-4
WEIGHT_DECAY = 0.01
MODES = ("ddp", "fsdp")


class Run:
    """One mode's own model (DDP's hooks and FSDP's sharding change it)."""

    def __init__(self, mode):
        torch.manual_seed(0)  # every mode starts from the same weights
        self.mode = mode
        self.model = GPT(**GPT_CONFIG)
        self.parameters = sum(p.numel() for p in self.model.parameters())
        if mode == "ddp":
            self.forward = DistributedDataParallel(self.model)
        else:
            # dtrain's units: each block, then the root (wte, wpe, ln_f).
            for block in self.model.blocks:
                fully_shard(block)
            fully_shard(self.model)
            self.forward = self.model
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
        self.step_seconds = []


def train_step(run, tokens, targets):
    start = time.perf_counter()
    output = run.forward(tokens)
    loss = F.cross_entropy(output.flatten(0, -2), targets.flatten())
    loss.backward()
    run.optimizer.step()
    run.optimizer.zero_grad()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per mode per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--json", help="also write the results as JSON to this path")
    args = parser.parse_args()

    rank = start_peer("FSDP2", "AdamW")

    runs = [Run(mode) for mode in MODES]
    torch.manual_seed(1 + rank)  # each rank its own samples
    vocab, seq_len = GPT_CONFIG["vocab_size"], GPT_CONFIG["seq_len"]
    tokens = torch.randint(0, vocab, (BATCH, seq_len))
    targets = torch.randint(0, vocab, (BATCH, seq_len))
    for run in runs:
        for _ in range(args.warmup):
            train_step(run, tokens, targets)
    for _ in range(args.rounds):
        for run in runs:
            run.step_seconds += timed_round(lambda: train_step(run, tokens, targets), args.steps)

    if rank == 0:
        ddp = statistics.median_high(runs[0].step_seconds)
        rows = []
        print(f"\ngpt: {runs[0].parameters / 1e6:.2f}M parameters, per-rank batch {BATCH} x {seq_len} tokens, "
              f"median of {args.rounds} rounds x {args.steps} steps")
        print(f"{'mode':<10} {'step ms':>10} {'/ ddp':>9}")
        for run in runs:
            # median_high: the same element dtrain's median (sorted[n/2]) picks.
            step = statistics.median_high(run.step_seconds)
            print(f"{run.mode:<10} {step * 1e3:10.1f} {step / ddp:9.3f}")
            rows.append(dict(mode=run.mode, step_s=step, ratio_to_ddp=step / ddp, step_s_samples=run.step_seconds))
        if args.json:
            document = dict(implementation="pytorch", torch_version=torch.__version__,
                            world_size=dist.get_world_size(), backend="gloo", threads_per_rank=torch.get_num_threads(),
                            parameters=runs[0].parameters, batch_per_rank=BATCH, seq_len=seq_len,
                            steps_per_round=args.steps, rounds=args.rounds, warmup=args.warmup, optimizer="adamw",
                            rows=rows)
            with open(args.json, "w") as out:
                json.dump(document, out, indent=2)
                out.write("\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
