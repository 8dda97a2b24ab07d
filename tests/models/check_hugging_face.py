#!/usr/bin/env python3
"""GPT-2 and Llama against Hugging Face transformers (issue 22).

    check_hugging_face.py DTRAIN HF_LOGITS [--meshes]

Runs with the Python of the pinned torch wheel, where scripts/setup installs
transformers (pinned in scripts/versions.env). Exits 77 (CTest's skip) when
transformers cannot be imported.

For small random models written by transformers' save_pretrained: a GPT-2
(GPT2LMHeadModel), a Llama with grouped-query attention and rope_theta
500000 (LlamaForCausalLM, untied head), and a Llama with a tied head saved
in shards with model.safetensors.index.json. Every weight is perturbed from
transformers' initialisation so that a swapped, untransposed or skipped
tensor shows (LayerNorm weights are not all 1, biases not all 0).
1. Logits: dtrain's (hf_logits: the model from config.json, the weights
   through dtrain::hf::load_into) equal transformers' within 1e-5 (fp32).
2. Training: `dtrain train --init-from DIR --strategy fsdp` on 2 ranks, 10
   AdamW steps on a token file in order (--shuffle false), gives each step's
   loss within 1e-4 of the same training in PyTorch from the same weights
   and windows (AdamW, the cosine schedule dtrain logs); so does the same
   training on a mesh, each rank reading its slices of the directory's
   weights: GPT-2 on --tp 2 (transposed weights) and, with --meshes, the
   GQA Llama on (dp, tp) = (2, 2) under FSDP and the tied Llama on
   (dp, pp, tp) = (1, 2, 2) (its single key/value head whole on both tp
   ranks, the tied head on both ends of the pipeline).
3. Export: `dtrain checkpoint export --format hf` of the trained checkpoint
   loads in transformers (from_pretrained) and gives the logits dtrain
   computes from the same checkpoint in its own names (export without
   --format) within 1e-5, and the PyTorch-trained model's within 1e-4. With
   --meshes, so does the Llamas' checkpoint saved on the mesh, against
   dtrain's logits of it. (Against the PyTorch-trained model it is 9.1e-5 away for
   the tied Llama, 1.7e-5 for FSDP's: AdamW turns the mesh's other summation
   order in gradients near zero into steps of either sign, the same reason
   GPT-2's key biases, whose gradient is zero, differ by 9.5e-5.)
4. Refusals (exit code 2, the message naming the problem): a directory that
   lacks a tensor, one with a tensor the model does not have, a shape that
   differs, a config with rope_scaling, an architecture flag next to the
   directory's config.json.
"""

import glob
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
except ImportError as error:
    print("check_hugging_face: SKIP: %s (scripts/setup installs transformers into the torch venv)" % error)
    sys.exit(77)

VOCAB = 96
POSITIONS = 32
SEQ = 16
BATCH = 4
STEPS = 10
LR = 2e-3
WEIGHT_DECAY = 0.01


def fail(message):
    print("check_hugging_face: FAILED: " + message, flush=True)
    sys.exit(1)


def say(message):
    print("check_hugging_face: " + message, flush=True)


def perturb(model, seed):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)


def models():
    """(name, model, save_pretrained options)."""
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=32, n_layer=2, n_head=4,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=72, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=POSITIONS,
                                         rope_theta=500000.0, rms_norm_eps=1e-5))
    tied = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=POSITIONS,
                                        tie_word_embeddings=True))
    for seed, model in enumerate((gpt2, llama, tied)):
        perturb(model, seed + 1)
        model.eval()
    return [("gpt2", gpt2, {}), ("llama-gqa", llama, {}), ("llama-tied-sharded", tied, {"max_shard_size": "20KB"})]


def dtrain_logits(hf_logits, folder, model_dir, tokens, weights=None):
    tokens_file = os.path.join(folder, "tokens.safetensors")
    out = os.path.join(folder, "logits.safetensors")
    save_file({"tokens": tokens.contiguous()}, tokens_file)
    command = [hf_logits, model_dir, tokens_file, out] + ([weights] if weights else [])
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        fail("%s: exit code %d\n%s" % (" ".join(command), result.returncode, result.stdout + result.stderr))
    return load_file(out)["logits"]


def token_stream(count, seed):
    """Ids where each is mostly followed by a fixed successor: something to learn."""
    generator = torch.Generator().manual_seed(seed)
    successor = torch.randperm(VOCAB, generator=generator)
    ids, current = [], 0
    noise = torch.rand(count, generator=generator)
    jumps = torch.randint(0, VOCAB, (count,), generator=generator)
    for i in range(count):
        ids.append(current)
        current = int(successor[current]) if noise[i] < 0.9 else int(jumps[i])
    return ids


def run(command, expect=0):
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != expect:
        fail("%s: exit code %d, expected %d\n%s" % (" ".join(command), result.returncode, expect,
                                                   result.stdout[-3000:] + result.stderr[-3000:]))
    return result


def python_training(model, ids, lrs):
    """STEPS AdamW steps on the train split's windows in order; each step's loss."""
    model.train()
    train_ids = ids[:len(ids) - int(math.floor(len(ids) * 0.1))]
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WEIGHT_DECAY)
    losses = []
    for step in range(STEPS):
        windows = [train_ids[(step * BATCH + i) * SEQ:(step * BATCH + i) * SEQ + SEQ + 1] for i in range(BATCH)]
        batch = torch.tensor(windows, dtype=torch.long)
        logits = model(batch[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        for group in optimizer.param_groups:
            group["lr"] = lrs[step]
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


def cosine(step):
    """dtrain's schedule without warmup: cosine from LR to LR / 10 over the run."""
    lowest = LR * 0.1
    progress = min(1.0, step / (STEPS - 1))
    return lowest + (LR - lowest) * 0.5 * (1.0 + math.cos(math.pi * progress))


def dtrain_training(dtrain, folder, name, model_dir, data, parallel, checkpoints=None):
    """Each step's (loss, lr) of STEPS AdamW steps from the model directory."""
    metrics = os.path.join(folder, name + ".jsonl")
    run([dtrain, "train", "--init-from", model_dir, "--data", "tokens:" + data] + parallel +
        ["--steps", str(STEPS), "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--optimizer", "adamw",
         "--lr", str(LR), "--weight-decay", str(WEIGHT_DECAY), "--shuffle", "false", "--log-every", "1",
         "--eval-windows", "2", "--metrics", metrics] + (["--checkpoint-dir", checkpoints] if checkpoints else []))
    records = [json.loads(line) for line in open(metrics)]
    steps = [r for r in records if "loss" in r and "step" in r and not r.get("final")]
    if len(steps) != STEPS:
        fail("%s: %d step losses in %s, expected %d" % (name, len(steps), metrics, STEPS))
    return [r["loss"] for r in steps], [r["lr"] for r in steps]


def check_training(dtrain, hf_logits, folder, name, model, model_dir, probe, meshes):
    ids = token_stream(3000, 7)
    data = os.path.join(folder, "tokens.bin")
    with open(data, "wb") as f:
        f.write(struct.pack("<%dH" % len(ids), *ids))
    checkpoints = os.path.join(folder, name + "-checkpoints")
    mesh_checkpoints = os.path.join(folder, name + "-mesh-checkpoints")
    llama = name.startswith("llama") and meshes
    losses, logged_lrs = dtrain_training(dtrain, folder, name, model_dir, data,
                                         ["--strategy", "fsdp", "--nproc", "2"], checkpoints)
    lrs = [cosine(step) for step in range(STEPS)]
    if any(abs(logged - lr) > 1e-12 for logged, lr in zip(logged_lrs, lrs)):
        fail("%s: dtrain's learning rates %s are not the schedule %s" % (name, logged_lrs, lrs))
    # On a mesh each rank reads its slices of the directory's weights; the
    # Llamas' exports below come from the checkpoints saved there.
    mesh = {"gpt2": ["--strategy", "single", "--tp", "2", "--nproc", "2"],
            "llama-gqa": ["--strategy", "fsdp", "--tp", "2", "--nproc", "4"],
            "llama-tied-sharded": ["--strategy", "single", "--tp", "2", "--pp", "2", "--microbatches", "2",
                                   "--nproc", "4"]}[name]
    tensor_parallel = None
    if llama or name == "gpt2":
        tensor_parallel, _ = dtrain_training(dtrain, folder, name + "-mesh", model_dir, data, mesh,
                                             mesh_checkpoints if llama else None)
    reference = python_training(model, ids, lrs)
    worst = max(abs(a - b) for a, b in zip(losses, reference))
    say("%s: FSDP on 2 ranks vs PyTorch, 10 AdamW steps: loss %.5f -> %.5f, worst difference %.2e" %
        (name, losses[0], losses[-1], worst))
    if worst > 1e-4:
        fail("%s: dtrain's losses %s differ from PyTorch's %s by %.2e (> 1e-4)" % (name, losses, reference, worst))
    if tensor_parallel:
        worst = max(abs(a - b) for a, b in zip(tensor_parallel, reference))
        say("%s: %s vs PyTorch: worst difference %.2e" % (name, " ".join(mesh), worst))
        if worst > 1e-4:
            fail("%s: the losses on %s, %s, differ from PyTorch's %s by %.2e (> 1e-4)" %
                 (name, " ".join(mesh), tensor_parallel, reference, worst))

    check_export(dtrain, hf_logits, folder, name, model, probe, checkpoints, against_python=True)
    if llama:
        check_export(dtrain, hf_logits, folder, name + "-mesh", model, probe, mesh_checkpoints, against_python=False)


def check_export(dtrain, hf_logits, folder, name, model, probe, checkpoints, against_python):
    """Exports the last checkpoint both ways; transformers loads the hf one."""
    last = sorted(glob.glob(os.path.join(checkpoints, "*")))[-1]
    exported = os.path.join(folder, name + "-exported")
    run([dtrain, "checkpoint", "export", last, "--to", exported, "--format", "hf", "--max-shard-size", "30KB"])
    own_names = os.path.join(folder, name + "-dtrain.safetensors")
    run([dtrain, "checkpoint", "export", last, "--to", own_names])
    loaded = transformers.AutoModelForCausalLM.from_pretrained(exported)
    loaded.eval()
    with torch.no_grad():
        theirs = loaded(probe).logits
        trained = model(probe).logits
    ours = dtrain_logits(hf_logits, folder, exported, probe, weights=own_names)
    by_dtrain = (theirs - ours).abs().max().item()
    by_python = (theirs - trained).abs().max().item()
    shards = len(glob.glob(os.path.join(exported, "*.safetensors")))
    say("%s: exported (%d safetensors files) and loaded by transformers: logits differ from dtrain's by %.2e, from "
        "the PyTorch-trained model's by %.2e" % (name, shards, by_dtrain, by_python))
    if by_dtrain > 1e-5:
        fail("%s: transformers' logits of the export differ from dtrain's by %.2e (> 1e-5)" % (name, by_dtrain))
    if against_python and by_python > 1e-4:
        fail("%s: the export's logits differ from the PyTorch-trained model's by %.2e (> 1e-4)" % (name, by_python))
    if shards < 2:
        fail("%s: --max-shard-size 30KB wrote %d safetensors file(s); expected shards and an index" % (name, shards))


def expect_refusal(dtrain, model_dir, words, extra=()):
    result = run([dtrain, "train", "--init-from", model_dir, "--data", "tokens:/dev/null", "--steps", "1",
                  "--nproc", "1", "--strategy", "single"] + list(extra), expect=2)
    message = result.stderr.strip()
    for word in words:
        if word not in message:
            fail("the refusal %r does not say %r" % (message, word))
    say("refused: " + message.splitlines()[-1][:200])


def check_refusals(dtrain, folder, model_dir):
    def copy(name):
        target = os.path.join(folder, name)
        shutil.copytree(model_dir, target)
        return target

    weights = load_file(os.path.join(model_dir, "model.safetensors"))
    missing = copy("missing")
    save_file({k: v for k, v in weights.items() if k != "model.layers.1.mlp.up_proj.weight"},
              os.path.join(missing, "model.safetensors"), metadata={"format": "pt"})
    expect_refusal(dtrain, missing, ["model.layers.1.mlp.up_proj.weight", "missing"])
    unknown = copy("unknown")
    save_file(dict(weights, **{"model.layers.0.extra.weight": torch.zeros(3)}),
              os.path.join(unknown, "model.safetensors"), metadata={"format": "pt"})
    expect_refusal(dtrain, unknown, ["model.layers.0.extra.weight", "not in the model"])
    shape = copy("shape")
    save_file(dict(weights, **{"model.norm.weight": torch.ones(33)}), os.path.join(shape, "model.safetensors"),
              metadata={"format": "pt"})
    expect_refusal(dtrain, shape, ["model.norm.weight", "[33]", "[32]"])
    scaled = copy("rope_scaling")
    config = json.load(open(os.path.join(scaled, "config.json")))
    config["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    json.dump(config, open(os.path.join(scaled, "config.json"), "w"))
    expect_refusal(dtrain, scaled, ["rope_scaling", "linear"])
    expect_refusal(dtrain, model_dir, ["--gpt-dim", "config.json"], ["--gpt-dim", "64"])


def main():
    dtrain, hf_logits = sys.argv[1], sys.argv[2]
    meshes = "--meshes" in sys.argv[3:]
    say("transformers %s, torch %s" % (transformers.__version__, torch.__version__))
    torch.set_num_threads(1)
    probe = torch.randint(0, VOCAB, (3, POSITIONS), generator=torch.Generator().manual_seed(3))
    with tempfile.TemporaryDirectory() as folder:
        for name, model, options in models():
            model_dir = os.path.join(folder, name)
            model.save_pretrained(model_dir, **options)
            with torch.no_grad():
                theirs = model(probe).logits
            ours = dtrain_logits(hf_logits, folder, model_dir, probe)
            worst = (theirs - ours).abs().max().item()
            files = len(glob.glob(os.path.join(model_dir, "*.safetensors")))
            say("%s (%d safetensors files): dtrain's logits differ from transformers' by %.2e (largest logit %.2f)" %
                (name, files, worst, theirs.abs().max().item()))
            if worst > 1e-5:
                fail("%s: dtrain's logits differ from transformers' by %.2e (> 1e-5)" % (name, worst))
            check_training(dtrain, hf_logits, folder, name, model, model_dir, probe, meshes)
            if name == "llama-gqa":
                check_refusals(dtrain, folder, model_dir)
    say("OK")


if __name__ == "__main__":
    main()
