#include "train.h"
#include "plan_search.h"

#include "elastic.h"
#include "launch.h"
#include "relaunch.h"
#include "train/restarts.h"

#include "dtrain/comm.h"
#include "dtrain/fsdp_compression.h"
#include "dtrain/model_spec.h"
#include "dtrain/tokenizer.h"
#include "dtrain/strategy_table.h"
#include "dtrain/train.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <tuple>

namespace dtrain::cli {

// --model: a name in the model registry (dtrain/model_spec.h), the built-ins
// and whatever the program registered before dtrain::cli::main.
const CLI::Validator kRegisteredModel(
    [](std::string& value) -> std::string {
      if (has_model(value)) return "";
      std::string names;
      for (const auto& name : model_names()) names += (names.empty() ? "" : ", ") + name;
      return "'" + value + "' is not one of the registered models: " + names;
    },
    "MODEL");

CLI::Option* add_model_options(CLI::App& app, std::map<std::string, std::string>& options) {
  return app
      .add_option_function<std::vector<std::string>>(
          "--model-option",
          [&options](const std::vector<std::string>& pairs) {
            for (const auto& pair : pairs) {
              const size_t equals = pair.find('=');
              if (equals == std::string::npos || equals == 0)
                throw CLI::ValidationError("--model-option", "'" + pair + "' is not KEY=VALUE");
              options[pair.substr(0, equals)] = pair.substr(equals + 1);
            }
          },
          "KEY=VALUE[,KEY=VALUE...] for a model of one's own (its spec reads TrainConfig::model_options); repeatable")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->delimiter(',');
}

namespace {

// LibTorch's errors carry a C++ backtrace in what(); users need the message.
std::string message_of(const std::exception& error) {
  if (const auto* torch_error = dynamic_cast<const c10::Error*>(&error)) return torch_error->what_without_backtrace();
  return error.what();
}


// What the flags say, before per-model defaults are filled in.
struct TrainFlags {
  TrainConfig config;
  std::string nproc;  // N or MIN:MAX (elastic.h); "" = default_nproc
  std::string hosts;
  std::string backend = "mpi";
  std::string shuffle = "true";
  int max_restarts = 0;
  std::string parallel = "manual";  // --parallel manual | auto
  std::string plan_link;            // --plan-link: the links --parallel auto times layouts on
};

// CLI11 2.1's PositiveNumber and NonNegativeNumber spell out a range up to
// DBL_MAX in their messages; these say it plainly ("--lr: must be > 0, got -1").
CLI::Validator number_above(double bound, bool inclusive) {
  const std::string relation = inclusive ? ">= " : "> ";
  std::string shown = std::to_string(bound);
  shown.erase(shown.find_last_not_of('0') + 1);
  if (shown.back() == '.') shown.pop_back();
  return CLI::Validator(
      [=](std::string& value) -> std::string {
        double number = 0;
        const bool ok = CLI::detail::lexical_cast(value, number) && (inclusive ? number >= bound : number > bound);
        return ok ? "" : "must be " + relation + shown + ", got '" + value + "'";
      },
      relation + shown);
}
const CLI::Validator kPositive = number_above(0, false);
const CLI::Validator kNonNegative = number_above(0, true);
const CLI::Validator kFraction(
    [](std::string& value) -> std::string {
      double number = 0;
      const bool ok = CLI::detail::lexical_cast(value, number) && number >= 0 && number < 1;
      return ok ? "" : "must be in [0, 1), got '" + value + "'";
    },
    "[0, 1)");

std::string models_help() {
  std::string text = "The model to train, one of the registered:";
  for (const auto& name : model_names()) {
    const std::string& summary = find_model(name).summary;
    text += "\n  " + name + (summary.empty() ? "" : ": " + summary);
  }
  return text + "\n(default: the --model-config's, else mlp)";
}

// Flags whose default depends on --model or --optimizer (see resolve_defaults).
constexpr const char* kModelDefaults = "(default: 128 for mlp and cnn, 32 for gpt)";

// A flag that takes on | off into `target`.
void add_on_off(CLI::Option_group* group, const std::string& flag, bool& target, const std::string& help) {
  group->add_option_function<std::string>(flag, [&target](const std::string& value) { target = value == "on"; }, help)
      ->check(CLI::IsMember({"on", "off"}));
}

void declare_flags(CLI::App& app, TrainFlags& f) {
  TrainConfig& c = f.config;
  // A flag given twice takes its last value, so scripts can append overrides.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_config("--config", "", "Read flags from a TOML file (keys are flag names: model = \"gpt\", "
                                 "gpt-layers = 4, mlp-hidden = [256, 256]); flags given on the command line win");
  app.allow_config_extras(CLI::config_extras_mode::error);

  auto* model = app.add_option_group("Model");
  model->add_option("--model", c.model, models_help())->check(kRegisteredModel)->capture_default_str();
  add_model_options(*model, c.model_options);
  model->add_option("--model-config", c.model_config,
                    "A Hugging Face config.json that gives the model and its architecture (a model_type a registered "
                    "model's ModelSpec::hugging_face reads; default: "
                    "--init-from DIR's config.json)")
      ->check(CLI::ExistingFile);
  model->add_option("--kv-heads", c.kv_heads, "llama: key/value heads, dividing --gpt-heads (default: --gpt-heads)")
      ->check(kPositive);
  model->add_option("--ffn-dim", c.ffn_dim, "llama: the SwiGLU MLP's width (default: 8/3 x --gpt-dim rounded up to 64)")
      ->check(kPositive);
  model->add_option("--rope-theta", c.rope_theta, "llama: the rotary embeddings' base")->capture_default_str();
  model->add_flag("--tie-embeddings", c.tie_embeddings, "llama: the output head is the token embedding");
  model->add_option("--mlp-hidden", c.mlp_hidden, "MLP hidden widths, comma-separated")
      ->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->check(kPositive)
      ->capture_default_str();
  model->add_option("--gpt-layers", c.gpt_layers, "GPT transformer blocks")->check(kPositive)
      ->capture_default_str();
  model->add_option("--gpt-dim", c.gpt_dim, "GPT embedding width")->check(kPositive)->capture_default_str();
  model->add_option("--gpt-heads", c.gpt_heads, "GPT attention heads (must divide --gpt-dim)")
      ->check(kPositive)->capture_default_str();
  model->add_option("--seq-len", c.seq_len, "GPT context length in bytes (the training windows' length)")
      ->check(kPositive)->capture_default_str();
  model->add_option("--dropout", c.dropout, "Dropout probability")->check(kFraction)
      ->capture_default_str();
  model->add_option("--vocab-size", c.vocab_size,
                    "GPT vocabulary: token ids 0..N-1 (256 for --data text:PATH's bytes; a token file's ids must "
                    "fall below it)")
      ->check(kPositive)->capture_default_str();

  auto* data = app.add_option_group("Data");
  data->add_option("--data", c.data,
                   "fashion-mnist | text:PATH (a text file or folder) | tokens:PATH (a token file: nanoGPT's "
                   "flat uint16/uint32 or llm.c's; or a folder with train.bin and val.bin, or NAME_train.bin and "
                   "NAME_val.bin) (default: fashion-mnist for mlp and cnn, text:/usr/share/games/fortunes for gpt)")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            if (value == "fashion-mnist" || (value.rfind("text:", 0) == 0 && value.size() > 5) ||
                (value.rfind("tokens:", 0) == 0 && value.size() > 7))
              return "";
            return "'" + value + "' is not one of: fashion-mnist, text:PATH, tokens:PATH";
          },
          "fashion-mnist|text:PATH|tokens:PATH"));
  data->add_option("--token-dtype", c.token_dtype,
                   "tokens:PATH: auto (llm.c's header says; else nanoGPT's uint16) | uint16 | uint32 (a flat file)")
      ->check(CLI::IsMember({"auto", "uint16", "uint32"}))->capture_default_str();
  data->add_option("--shuffle", f.shuffle, "Shuffle each epoch (seeded): true | false")
      ->check(CLI::IsMember({"true", "false"}))->capture_default_str();

  auto* device = app.add_option_group("Device");
  device->add_option("--device", c.device,
                     "cpu | cuda (rank r on GPU LOCAL_RANK; collectives on CUDA tensors through NCCL, or Gloo when "
                     "ranks share a GPU) | auto (cuda when there is a GPU)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))->capture_default_str();
  add_on_off(device, "--tf32", c.tf32,
             "cuda: fp32 matmuls and convolutions on TF32 tensor cores: on (default) | off (full fp32)");
  add_on_off(device, "--comm-streams", c.comm_streams,
             "cuda: FSDP's and DDP's collectives on CUDA streams of their own, overlapping compute: on (default) | "
             "off (on the compute stream)");
  device->add_option("--peak-tflops", c.peak_tflops,
                     "The device's peak TFLOP/s for the compute dtype, MFU's denominator (default: measured once per "
                     "machine by a GEMM probe and cached)")
      ->check(kNonNegative);

  auto* parallel = app.add_option_group("Parallelism");
  const auto strategies = strategy_names();
  parallel->add_option("--strategy", c.strategy, strategy_list())
      ->check(CLI::IsMember(strategies))->capture_default_str();
  parallel->add_option("--nproc", f.nproc,
                       "Ranks to start (default: min(4, cores); 1 for --strategy single), or MIN:MAX with --hosts and "
                       "--max-restarts: a restart goes on with the hosts that remain (at least MIN ranks) and grows "
                       "back up to MAX (docs/elastic.md). Inside a launched job the job's ranks are used.")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            try {
              parse_rank_range(value, "--nproc");
              return "";
            } catch (const std::invalid_argument& error) {
              return std::string(error.what()).substr(std::string("--nproc ").size());
            }
          },
          "N|MIN:MAX"));
  add_hosts_option(*parallel, f.hosts);
  parallel->add_option("--tp", c.tp,
                       "Tensor parallelism (a model whose spec has ModelSpec::tensor_parallel: gpt, gpt2, llama), splitting every block across N consecutive ranks (a (dp, tp) mesh "
                       "with dp = ranks / N; --strategy runs over the dp groups)")
      ->check(kPositive)->capture_default_str();
  parallel->add_flag("--sequence-parallel", c.sequence_parallel,
                     "With --tp: split the activations outside attention and the MLP (residual stream, LayerNorms) "
                     "along the sequence too, instead of holding them whole on every rank of the group");
  parallel->add_option("--pp", c.pp,
                       "Pipeline parallelism (a spec with ModelSpec::pipeline_stage: gpt, gpt2, llama), the blocks in N consecutive stages on N groups of ranks (a (dp, pp) "
                       "mesh with dp = ranks / N; --strategy runs over the dp groups of each stage)")
      ->check(kPositive)->capture_default_str();
  parallel->add_option("--cp", c.cp,
                       "Context parallelism (a spec with ModelSpec::context_parallel: gpt, gpt2, llama): every "
                       "sequence split over N ranks, a head and a tail chunk each so the causal work is even; "
                       "attention runs as ring attention (a (dp, pp, cp, tp) mesh; --strategy runs over dp x cp; "
                       "--seq-len a multiple of 2N)")
      ->check(kPositive)->capture_default_str();
  add_on_off(parallel, "--cp-overlap", c.cp_overlap,
             "With --cp: on (default: the next key/value block travels while the block in hand is computed) | off "
             "(each ring step waits for its block first; to measure the exposed communication)");
  parallel->add_option("--microbatches", c.microbatches,
                       "With --pp: each rank's part of the batch runs through the stages as M microbatches (more: a "
                       "smaller pipeline bubble, (pp-1)/(M+pp-1) of the step)")
      ->check(kPositive)->capture_default_str();
  parallel->add_option("--schedule", c.schedule,
                       "With --pp: 1f1b (one forward, one backward: at most pp microbatches' activations alive), "
                       "gpipe (all forwards, then all backwards: all M alive) or interleaved (1F1B over "
                       "--virtual-stages chunks per rank: a bubble of about (pp-1)/(v M+pp-1), more activations "
                       "alive and v times the messages; M a multiple of pp)")
      ->check(CLI::IsMember({"1f1b", "gpipe", "interleaved"}))->capture_default_str();
  parallel->add_option("--virtual-stages", c.virtual_stages,
                       "With --schedule interleaved: the model chunks each pipeline rank holds (v >= 2; the model is "
                       "pp x v stages, rank s holding stages s, s + pp, ...)")
      ->check(kPositive)->capture_default_str();
  parallel->add_option("--pp-gather", c.pp_gather,
                       "With --pp and zero1, zero2, fsdp or hsdp: step (gather each unit of the stage once per step "
                       "and hold it: fewest gathers) or microbatch (gather a unit for each microbatch's forward and "
                       "backward: about one unit's full parameters at a time, up to 2 x M gathers per unit)")
      ->check(CLI::IsMember({"step", "microbatch"}))->capture_default_str();
  parallel->add_option("--backend", f.backend, "How the started ranks find each other: mpi | c10d")
      ->check(CLI::IsMember({"mpi", "c10d"}))->capture_default_str();
  parallel->add_option("--compress", c.compress, "DDP gradient compression: none | bf16 | powersgd | topk")
      ->check(CLI::IsMember({"none", "bf16", "powersgd", "topk"}))->capture_default_str();
  parallel->add_option("--fsdp-compress", c.fsdp_compress,
                       "zero1, zero2, fsdp, hsdp: compressed collectives, e.g. params=int8,grads=bf16 "
                       "(params=none|bf16|int8|fp8, grads=none|bf16|int8, block=N elements per scale; docs/fsdp.md)")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            try {
              parse_collective_compression(value);
              return "";
            } catch (const std::invalid_argument& error) {
              return std::string(error.what()).substr(std::string("--fsdp-compress: ").size());
            }
          },
          "COMPRESSION"))
      ->capture_default_str();
  parallel->add_option("--mixed-precision", c.mixed_precision,
                       "none | bf16: compute in bf16, the optimizer updating fp32 master weights (every strategy but "
                       "ps-*)")
      ->check(CLI::IsMember({"none", "bf16"}))->capture_default_str();
  parallel->add_option("--reduce-dtype", c.reduce_dtype,
                       "With --mixed-precision bf16: the gradient all-reduce / reduce-scatter in fp32 (exact "
                       "averages) or bf16 (half the traffic)")
      ->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  parallel->add_option("--fp8", c.fp8,
                       "off | tensorwise | rowwise: the model's linear layers (gpt, gpt2, llama: the blocks') multiply "
                       "in fp8 with dynamic scales per tensor or per row; the head and embeddings stay (docs/fp8.md)")
      ->check(CLI::IsMember({"off", "tensorwise", "rowwise"}))->capture_default_str();
  parallel->add_option("--fp8-min-width", c.fp8_min_width,
                       "With --fp8: layers y = x W^T, W [N, K], run in fp8 when K N / (K + N) >= this (and K, N are "
                       "multiples of 16); smaller layers lose more to the casts than fp8 saves. 0: every layer")
      ->capture_default_str();
  add_on_off(parallel, "--fp8-all-gather", c.fp8_all_gather,
             "With --fp8 tensorwise and a sharded strategy: all-gather the weights the fp8 layers multiply as fp8 "
             "(a byte per element; the same training) from the second step: on (default) | off");
  parallel->add_option("--parallel", f.parallel,
                       "manual: the layout flags given (default) | auto: the fastest layout `dtrain plan --search` "
                       "predicts for --nproc ranks that fits this machine's memory (mesh, strategy, microbatches, "
                       "schedule, prefetch, activation checkpointing); leave those flags out")
      ->check(CLI::IsMember({"manual", "auto"}))->capture_default_str();
  parallel->add_option("--plan-link", f.plan_link,
                       "With --parallel auto: the links to time layouts on, as dtrain plan --link takes them "
                       "(LATENCY_US,GB_PER_S, intra=...,inter=..., or a `dtrain bench collectives --json` file)");
  // What --parallel auto chose, passed to the ranks it starts (hidden).
  app.add_option("--parallel-chosen", c.parallel_auto)->group("");
  app.add_option("--parallel-predicted-step-s", c.parallel_auto_predicted_step_s)->group("");
  parallel->add_option("--fsdp-prefetch", c.fsdp_prefetch,
                       "zero1/zero2/fsdp/hsdp: prefetch the next unit's all-gather: on | off | auto (time both "
                       "in the first steps, keep the faster)")
      ->check(CLI::IsMember({"on", "off", "auto"}))->capture_default_str();
  add_on_off(parallel, "--activation-checkpointing", c.activation_checkpointing,
             "zero1/zero2/fsdp/hsdp, a model with ModelSpec::checkpointable_blocks: on (keep only each block's input from forward to "
             "backward and recompute the block in its backward: less memory, one more forward of the blocks per "
             "step) | off (default)");
  // Parameter server and stragglers (issue 7; src/train/ps_training.h, src/train/stragglers.h).
  parallel->add_option("--servers", c.servers, "ps-*: the last S ranks are servers, the others workers")
      ->capture_default_str();
  parallel->add_option("--staleness", c.staleness, "ps-ssp: the most steps a worker may run ahead of the slowest")
      ->capture_default_str();
  parallel->add_option("--backup-workers", c.backup_workers,
                       "ps-sync: apply each step with the first W-k gradients, dropping the late ones")
      ->capture_default_str();
  parallel->add_option_function<std::string>(
      "--slow-rank",
      [&c](const std::string& text) {
        try {
          std::tie(c.slow_rank, c.slow_factor) = parse_slow_rank(text);
        } catch (const std::invalid_argument& error) {
          throw CLI::ValidationError(error.what());
        }
      },
      "R:FACTOR: before each forward, rank R sleeps (FACTOR-1) x its last forward+backward time (a deliberate straggler)");
  parallel->add_flag("--balance", c.balance,
                     "ddp, ps-sync: after 5 steps, re-split the global batch by each rank's measured samples/s");

  auto* length = app.add_option_group("Length");
  auto* steps = length->add_option("--steps", c.steps, "Optimizer steps")->check(kPositive);
  auto* epochs = length->add_option("--epochs", c.epochs, "Passes over the train split (default: 1)")
                     ->check(kPositive);
  steps->excludes(epochs);
  length->add_option("--batch-size", c.batch_size, std::string("Global batch: samples per step over all ranks ") +
                                                       kModelDefaults)
      ->check(kPositive);

  auto* optimisation = app.add_option_group("Optimisation");
  optimisation->add_option("--optimizer", c.optimizer, "sgd | adamw (default: sgd for mlp and cnn, adamw for gpt)")
      ->check(CLI::IsMember({"sgd", "adamw"}));
  optimisation->add_option("--lr", c.lr, "Peak learning rate (default: sgd 0.05, adamw 0.001)")
      ->check(kPositive);
  optimisation->add_option("--momentum", c.momentum, "SGD momentum")->check(kFraction)
      ->capture_default_str();
  optimisation->add_option("--weight-decay", c.weight_decay, "Weight decay (default: sgd 0, adamw 0.01)")
      ->check(kNonNegative);
  optimisation->add_option("--warmup", c.warmup,
                           "Steps of linear warmup; then the rate decays along a cosine to 10% at the last step")
      ->check(kNonNegative)->capture_default_str();
  optimisation->add_option("--grad-clip", c.grad_clip, "Clip the global gradient norm to this (0: off)")
      ->check(kNonNegative)->capture_default_str();
  optimisation->add_option("--seed", c.seed, "Seed of the initial weights, the shuffle and the samples")
      ->capture_default_str();
  optimisation->add_option("--init-from", c.init_from,
                           "Initial weights from FILE.safetensors (every parameter and buffer of the model, by name; "
                           "--seed still seeds the shuffle and the samples)");
  optimisation->add_option("--on-nonfinite", c.on_nonfinite,
                           "A step with a NaN or infinite loss (or gradient norm, with --grad-clip): stop with an "
                           "error naming it, or skip it (weights and optimizer state stay as they were)")
      ->check(CLI::IsMember({"stop", "skip"}))->capture_default_str();
  optimisation->add_option("--debug-nan-at-step", c.debug_nan_at_step, "(testing) make rank 0's loss NaN at step K")
      ->group("");

  auto* checkpoints = app.add_option_group("Checkpoints");
  checkpoints->add_option("--checkpoint-dir", c.checkpoint_dir,
                          "Save sharded checkpoints in DIR/step-NNNNNNNN (at the end, every --checkpoint-every steps, "
                          "and on SIGINT/SIGTERM, which then stop the run at the next step)");
  checkpoints->add_option("--checkpoint-every", c.checkpoint_every, "Save every K steps (0: only at the end)")
      ->check(kNonNegative)->capture_default_str();
  checkpoints->add_option("--keep-last", c.keep_last, "Checkpoints kept in --checkpoint-dir (0: all)")
      ->check(kNonNegative)->capture_default_str();
  checkpoints->add_flag("--checkpoint-async", c.checkpoint_async,
                        "Write checkpoints in the background: the step that saves copies its state to host memory "
                        "and goes on; the next save, the end and a stop signal wait for the write");
  checkpoints->add_option("--max-restarts", f.max_restarts,
                          "When a rank dies or fails, restart the job from the newest checkpoint in --checkpoint-dir, "
                          "up to K times (the restarts and steps lost go to the final metrics line)")
      ->check(kNonNegative)->capture_default_str();
  checkpoints->add_flag("--resume", c.resume,
                        "Continue from the newest complete checkpoint in --checkpoint-dir (any --strategy and "
                        "--nproc; none there: start afresh)");

  auto* output = app.add_option_group("Output");
  output->add_option("--eval-every", c.eval_every, "Evaluate every K steps (0: only at the end)")
      ->check(kNonNegative)->capture_default_str();
  output->add_option("--eval-windows", c.eval_windows, "GPT: validation windows per evaluation")
      ->check(kPositive)->capture_default_str();
  output->add_option("--samples", c.samples, "GPT: text samples generated at the end (0: none)")
      ->check(kNonNegative)->capture_default_str();
  output->add_option("--tokenizer", c.tokenizer,
                     "--data tokens:PATH: the SentencePiece model (dtrain tokenize's PREFIX.model) that decodes the "
                     "samples; its vocabulary is --vocab-size's default")
      ->check(CLI::ExistingFile);
  output->add_option("--log-every", c.log_every, "Progress and metrics lines every K steps")
      ->check(kPositive)->capture_default_str();
  output->add_option("--metrics", c.metrics_path, "Write metrics as JSON Lines to PATH (its folder must exist)");
  output->add_option("--trace", c.trace_path,
                     "Write every rank's timeline (compute, collectives, waits, memory) to PATH as Chrome trace JSON "
                     "for Perfetto; summarise it with dtrain trace summary PATH");
}

bool given(const CLI::App& app, const std::string& flag) { return app.count(flag) > 0; }

// A Hugging Face config.json (--model-config, or --init-from DIR's) gives
// the transformer's architecture: the flags that would say it are refused.
void resolve_model_config(const CLI::App& app, TrainConfig& c) {
  const std::string source = model_config_path(c);
  if (source.empty()) return;
  for (const char* flag : {"--gpt-layers", "--gpt-dim", "--gpt-heads", "--vocab-size", "--kv-heads", "--ffn-dim",
                           "--rope-theta", "--tie-embeddings"}) {
    if (given(app, flag))
      throw std::invalid_argument(std::string(flag) + ": the architecture comes from " + source +
                                  "; leave the flag out (or edit the file)");
  }
  if (given(app, "--model") && has_model(c.model) && !find_model(c.model).hugging_face)
    throw std::invalid_argument(source + " is a Hugging Face config.json: --model " + c.model +
                                " cannot be built from it (its spec has no ModelSpec::hugging_face)");
  apply_model_config(c);
  // Windows as long as the model's context, up to the default's 128.
  if (!given(app, "--seq-len")) c.seq_len = std::min<int64_t>(c.seq_len, c.positions);
}

// Fills in the defaults that depend on other flags.
void resolve_defaults(const CLI::App& app, TrainFlags& f) {
  TrainConfig& c = f.config;
  resolve_model_config(app, c);
  const bool gpt = is_language_model(c.model);
  if (!given(app, "--data")) c.data = gpt ? "text:/usr/share/games/fortunes" : "fashion-mnist";
  if (!given(app, "--batch-size")) c.batch_size = gpt ? 32 : 128;
  // Token ids are samples only with a tokenizer to decode them.
  if (!given(app, "--samples") && c.data.rfind("tokens:", 0) == 0 && c.tokenizer.empty()) c.samples = 0;
  // The tokenizer's vocabulary, unless a flag or config.json says another.
  if (!c.tokenizer.empty() && !given(app, "--vocab-size") && c.model_config_json.empty())
    c.vocab_size = data::Tokenizer(c.tokenizer).vocab_size();
  if (!given(app, "--optimizer")) c.optimizer = gpt ? "adamw" : "sgd";
  const bool adamw = c.optimizer == "adamw";
  if (!given(app, "--lr")) c.lr = adamw ? 1e-3 : 0.05;
  if (!given(app, "--weight-decay")) c.weight_decay = adamw ? 0.01 : 0.0;
  if (!given(app, "--steps") && !given(app, "--epochs")) c.epochs = 1;
  c.shuffle = f.shuffle == "true";
}

int default_nproc(const TrainConfig& c) {
  const int model_parallel = c.tp * c.pp;  // the ranks one data-parallel replica spans
  if (const StrategyInfo* row = find_strategy(c.strategy); row && !row->multi_rank) return model_parallel;
  const int ranks = std::min(4, default_threads_per_rank(1));  // the cores this process may use
  return ranks % model_parallel == 0 ? ranks : model_parallel;
}

// One rank: this process's part of the job.
// A failure names the rank and exits non-zero; in a job of several ranks the
// launcher then stops the others.
int train_rank(const TrainConfig& config, const CommPtr& world) {
  try {
    const TrainResult result = run_training(config, world);
    // Stopped by SIGINT/SIGTERM after saving a checkpoint: the usual exit
    // status of a signalled program, so scripts see it did not finish.
    return result.stopped_by_signal != 0 ? 128 + result.stopped_by_signal : 0;
  } catch (const std::exception& error) {
    const bool invalid = dynamic_cast<const std::invalid_argument*>(&error) != nullptr;
    // One write, so that ranks failing together do not interleave their lines;
    // the leading newline ends a live progress line.
    const std::string message = "\ndtrain train: rank " + std::to_string(world->rank()) + ": " +
                                (invalid ? "" : "error: ") + message_of(error) + "\n";
    std::cout << std::flush;
    std::cerr << message << std::flush;
    const int code = invalid ? 2 : 1;
    // Leave at once in a job of several ranks: the orderly exit (MPI_Finalize,
    // c10d's teardown) waits for every rank, and another may be waiting for
    // this one in a step that never comes (a parameter server waiting for a
    // push). The launcher then stops the others, as when a rank dies.
    if (world->size() > 1) std::_Exit(code);
    return code;
  }
}

}  // namespace

CLI::App* add_train_subcommand(CLI::App& app) {
  auto* train = app.add_subcommand("train", "Train a registered model (--model: the built-ins, or a program's own) on local ranks or as ranks of a launched job");
  // The arguments go to train_main, which parses them with their own
  // CLI::App: CLI11 reads --config files only for the app it parses.
  train->prefix_command();
  train->set_help_flag();
  return train;
}

void check_train_flags(const std::vector<std::string>& args, int nproc) {
  CLI::App app{"dtrain train", "dtrain train"};
  TrainFlags flags;
  declare_flags(app, flags);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& error) {
    throw std::invalid_argument(std::string("dtrain train refuses the flags: ") + error.what());
  }
  resolve_defaults(app, flags);
  check_train_config(flags.config, nproc);
}

namespace {

// The layout flags --parallel auto chooses.
constexpr const char* kLayoutFlags[] = {"--strategy",      "--tp",           "--sequence-parallel", "--pp",
                                        "--cp",            "--microbatches", "--schedule",          "--virtual-stages",
                                        "--pp-gather",     "--fsdp-prefetch", "--fsdp-compress",   "--activation-checkpointing"};

// `dtrain plan --search` for this run: its model, batch, precision and
// optimizer, on `nproc` ranks.
PlanFlags search_flags_of(const TrainConfig& c, int nproc, const std::string& link) {
  PlanFlags f;
  copy_model_flags(c, f);
  f.batch_size = c.batch_size;
  f.mixed_precision = c.mixed_precision;
  f.fp8 = c.fp8;
  f.fp8_min_width = c.fp8_min_width;
  f.fp8_all_gather = c.fp8_all_gather ? "on" : "off";
  f.optimizer = c.optimizer;
  f.momentum = c.momentum;
  f.nproc = nproc;
  f.link = link;
  f.search = true;
  f.top = 1;
  return f;
}

// --parallel auto: the search's best layout in place of the flags, then the
// run as if they had been given (each rank sees them, and what chose them).
int train_with_chosen_layout(const CLI::App& app, const TrainFlags& flags, const std::vector<std::string>& args,
                             int nproc) {
  for (const char* flag : kLayoutFlags)
    if (given(app, flag))
      throw std::invalid_argument(std::string("--parallel auto chooses ") + flag + " itself: leave it out, or give "
                                  "the whole layout by hand with --parallel manual");
  if (flags.plan_link.empty())
    throw std::invalid_argument("--parallel auto times each layout's collectives on a link: give --plan-link (measure "
                                "it once with `dtrain bench collectives --nproc " + std::to_string(nproc) +
                                " --json FILE`, then --plan-link FILE)");
  const SearchResult result = search_layouts(search_flags_of(flags.config, nproc, flags.plan_link));
  if (result.rows.empty())
    throw std::invalid_argument("--parallel auto: no layout of " + std::to_string(nproc) + " ranks fits (" +
                                std::to_string(result.over_memory) + " over the memory limit, " +
                                std::to_string(result.refused) + " not accepted); try more ranks or a smaller batch");
  const LayoutRow& best = result.rows.front();
  std::string chosen;
  for (const auto& word : best.train_flags) chosen += (chosen.empty() ? "" : " ") + word;
  std::cout << "dtrain train --parallel auto: " << chosen << " (the fastest of " << result.candidates
            << " layouts by predicted step time, " << best.time.seconds * 1e3 << " ms; `dtrain plan --search` lists them)"
            << std::endl;
  std::vector<std::string> rewritten;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--parallel" || args[i] == "--plan-link") {
      ++i;  // and its value
      continue;
    }
    if (args[i].rfind("--parallel=", 0) == 0 || args[i].rfind("--plan-link=", 0) == 0) continue;
    rewritten.push_back(args[i]);
  }
  rewritten.insert(rewritten.end(), best.train_flags.begin(), best.train_flags.end());
  // One word each (the value starts with "--", which CLI11 would take for a flag).
  rewritten.insert(rewritten.end(), {"--parallel-chosen=" + chosen,
                                     "--parallel-predicted-step-s=" + std::to_string(best.time.seconds)});
  return train_main(rewritten);
}

}  // namespace

int train_main(const std::vector<std::string>& args) {
  CLI::App app{"Train a model on local ranks (--nproc N) or as the ranks of a launched job", "dtrain train"};
  TrainFlags flags;
  declare_flags(app, flags);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes a vector last argument first
  try {
    app.parse(reversed);
  } catch (const CLI::ConfigError& error) {
    std::cerr << "dtrain train: --config: " << error.what()
              << " (the keys are flag names without the leading --, e.g. batch-size = 64)" << std::endl;
    return 2;
  } catch (const CLI::FileError& error) {
    std::cerr << "dtrain train: --config: " << error.what() << std::endl;
    return 2;
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;  // --help: 0; usage errors: 2
  }
  TrainConfig& config = flags.config;

  try {
    resolve_defaults(app, flags);
    if (flags.parallel == "auto" && backend_from_environment() != "self")
      throw std::invalid_argument("--parallel auto chooses the layout before the ranks start: run `dtrain train "
                                  "--nproc N --parallel auto` itself, not under a launcher (or give the layout "
                                  "`dtrain plan --search` lists by hand)");
    if (backend_from_environment() != "self") {
      // One rank of a job that a launcher (dtrain launch, mpirun, torchrun) started.
      auto world = init();
      // An elastic job's attempts run at any size in MIN:MAX.
      const RankRange range = given(app, "--nproc") ? parse_rank_range(flags.nproc, "--nproc")
                                                    : RankRange{world->size(), world->size()};
      if (world->size() < range.min || world->size() > range.max)
        throw std::invalid_argument("--nproc " + flags.nproc + " disagrees with the job's " +
                                    std::to_string(world->size()) + " ranks; leave --nproc out inside a launched job");
      // Set by dtrain launch: under mpirun a rank's stdout is a pseudo-terminal
      // even when the job's output goes to a file.
      if (const char* live = std::getenv("DTRAIN_PROGRESS_LIVE")) config.live_progress = std::string(live) == "1";
      // A restarted attempt (--max-restarts, ours or torchrun's) continues
      // from the newest checkpoint.
      if (train::restart_count_from_environment() > 0) config.resume = !config.checkpoint_dir.empty();
      return train_rank(config, world);
    }
    const int fixed = default_nproc(config);
    const RankRange range = given(app, "--nproc") ? parse_rank_range(flags.nproc, "--nproc") : RankRange{fixed, fixed};
    if (flags.parallel == "auto") {
      if (range.min != range.max)
        throw std::invalid_argument("--parallel auto plans one world size, not the elastic range --nproc " + flags.nproc);
      return train_with_chosen_layout(app, flags, args, range.max);
    }
    if (!flags.plan_link.empty()) throw std::invalid_argument("--plan-link times layouts for --parallel auto: add it");
    const int nproc = range.max;
    if (const StrategyInfo* row = find_strategy(config.strategy);
        row && !row->multi_rank && nproc > config.tp * config.pp)
      throw std::invalid_argument("--strategy " + config.strategy +
                                  (config.tp * config.pp > 1 ? " trains one replica (a rank per stage and "
                                                               "tensor-parallel slice: --nproc " +
                                                                   std::to_string(config.tp * config.pp) + ")"
                                                             : std::string(" trains one process")) +
                                  "; --nproc " +
                                  to_string(range) + " needs a data-parallel strategy such as --strategy ddp");
    // Every check that needs no data, before any rank starts: at both ends of
    // an elastic range.
    check_train_config(config, range.min);
    check_train_config(config, range.max);
    check_init_from(config);
    if (flags.max_restarts > 0 && config.checkpoint_dir.empty())
      throw std::invalid_argument("--max-restarts " + std::to_string(flags.max_restarts) +
                                  " restarts the job from its newest checkpoint: give --checkpoint-dir DIR (and "
                                  "--checkpoint-every N, so that a restart loses at most N steps)");
    if (nproc == 1 && flags.max_restarts == 0 && flags.hosts.empty()) {
      at::set_num_threads(default_threads_per_rank(1));  // all cores (DTRAIN_THREADS_PER_RANK overrides in init)
      return train_rank(config, init());
    }
    // Start nproc ranks of this command; each finds itself inside the job.
    std::vector<std::string> words{"train"};
    words.insert(words.end(), args.begin(), args.end());
    // With --max-restarts even one rank runs as a job: the launcher restarts it.
    return relaunch_as_job(words, nproc, flags.backend, 0, flags.hosts,
                           {.max_restarts = flags.max_restarts, .checkpoint_dir = config.checkpoint_dir,
                            .min_ranks = range.min});
  } catch (const std::invalid_argument& error) {
    std::cerr << "dtrain train: " + std::string(error.what()) + "\n" << std::flush;  // one write per line
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "dtrain train: error: " + message_of(error) + "\n" << std::flush;
    return 1;
  }
}

}  // namespace dtrain::cli
