"""What the PyTorch peers (ddp_peer.py, fsdp_peer.py) share: the reference GPT,
their start (threads, process group, banner) and the timing of one round.

The GPT is dtrain's (src/models/gpt.cpp, gpt_block.cpp) written in PyTorch:
token + position embeddings, pre-norm blocks (causal SDPA attention, then an
MLP 4x wide with exact GELU), ln_f, the head tied to wte, and GPT-2
initialisation. The parameters are created, and the initialisation draws its
random numbers, in the same order on every call, so a manual_seed before the
constructor gives every mode the same weights. Each peer keeps its own
GPT_CONFIG, in step with the C++ workload it mirrors (apps/dtrain/bench_ddp.cpp,
bench_fsdp.cpp).

The peers import this module by name: run as a script (python or torchrun),
a peer has its own folder, bench/peers/, on sys.path.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class GPTBlock(nn.Module):
    """dtrain::models::GPTBlock: pre-norm attention and MLP (4x), exact GELU."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.attn_proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp_fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        qkv = self.qkv(self.ln_1(x)).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.mlp_fc(self.ln_2(x))))


class GPT(nn.Module):
    """dtrain::models::GPT: token + position embeddings, blocks, ln_f, head tied to wte."""

    def __init__(self, vocab_size, seq_len, n_layer, n_embd, n_head):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(seq_len, n_embd)
        self.blocks = nn.ModuleList(GPTBlock(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        for module in self.modules():  # GPT-2 initialisation, as dtrain's
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)

    def forward(self, tokens):
        positions = torch.arange(tokens.size(1), device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


def timed_round(step, steps):
    """One timed round: a barrier, then `steps` calls of step() (each returns its
    seconds). Returns each step's slowest rank, gathered after the round (no
    collective between timed steps)."""
    dist.barrier()
    times = [step() for _ in range(steps)]
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist()


def start_peer(name, optimizer):
    """One intra-op thread per rank, as dtrain's ranks get, and the gloo process
    group; rank 0 prints the banner. Returns this rank."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        print(f"pytorch {torch.__version__} {name} peer: {dist.get_world_size()} ranks, backend gloo, "
              f"{torch.get_num_threads()} intra-op thread(s) per rank, fp32, {optimizer}", flush=True)
    return rank
