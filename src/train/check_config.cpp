// check_train_config (include/dtrain/train.h): everything about a TrainConfig
// that can be known before any data is read or any rank starts.
#include "dtrain/train.h"

#include "dtrain/float8.h"
#include "dtrain/hugging_face.h"
#include "dtrain/strategy_table.h"
#include "dtrain/tokenizer.h"
#include "train/device.h"
#include "train/model.h"
#include "train/strategy.h"
#include "train/training_data.h"

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain {
namespace {

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument(message); }

bool one_of(const std::string& value, const std::vector<std::string>& allowed) {
  for (const auto& a : allowed)
    if (value == a) return true;
  return false;
}

void check_positive(const char* flag, int64_t value) {
  if (value < 1) fail(std::string(flag) + " must be at least 1, got " + std::to_string(value));
}

// The registered models that train on --data's token sequences (or on its
// images), as "--model a, b or c", for the messages that suggest one.
std::string models_for(bool token_sequences) {
  std::vector<std::string> names;
  for (const auto& name : model_names()) {
    const ModelSpec& spec = find_model(name);
    if (!spec.data && spec.token_sequences == token_sequences) names.push_back(name);
  }
  std::string text = "--model ";
  for (size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return text;
}

void check_data(const TrainConfig& c, const ModelSpec& spec) {
  namespace fs = std::filesystem;
  if (spec.data) return;  // the spec brings its own datasets (ModelSpec::data)
  const std::string path = train::text_path(c.data);
  if (c.data == "fashion-mnist") {
    if (spec.token_sequences)
      fail("--data fashion-mnist holds images, for " + models_for(false) + "; --model " + c.model +
           " needs --data text:PATH or tokens:PATH");
    if (!fs::is_directory(c.fashion_mnist_dir))
      fail("Fashion-MNIST is not installed in " + c.fashion_mnist_dir +
           " (Debian package dataset-fashion-mnist; scripts/setup installs it)");
    return;
  }
  const std::string tokens = train::tokens_path(c.data);
  if (!tokens.empty()) {
    if (!spec.token_sequences)
      fail("--data tokens:PATH holds token ids, for " + models_for(true) + "; --model " + c.model +
           " needs --data fashion-mnist");
    std::error_code error;
    if (!fs::exists(tokens, error)) fail("--data tokens:" + tokens + ": no such file or folder");
    if (c.samples > 0 && c.tokenizer.empty())
      fail("--samples " + std::to_string(c.samples) + " decodes bytes, and --data tokens:PATH holds token ids: "
           "give the --tokenizer MODEL that made them (dtrain tokenize), or pass --samples 0");
    if (!c.tokenizer.empty()) {
      if (!fs::is_regular_file(c.tokenizer, error))
        fail("--tokenizer " + c.tokenizer + ": no such file (a SentencePiece .model, e.g. from dtrain tokenize)");
      if (const int64_t pieces = data::Tokenizer(c.tokenizer).vocab_size(); pieces > c.vocab_size)
        fail("--tokenizer " + c.tokenizer + " has " + std::to_string(pieces) + " pieces, more than --vocab-size " +
             std::to_string(c.vocab_size) + ": pass --vocab-size " + std::to_string(pieces) + " or more");
    }
    return;
  }
  if (!c.tokenizer.empty()) {
    fail("--tokenizer decodes token ids: it needs --data tokens:PATH (--data " + c.data + " is " +
         (c.data == "fashion-mnist" ? "images)" : "bytes, decoded as they are)"));
  }
  if (c.token_dtype != "auto") fail("--token-dtype says how --data tokens:PATH stores its ids; --data " + c.data + " has none");
  if (path.empty()) fail("--data '" + c.data + "' is not one of: fashion-mnist, text:PATH (a text file or folder), tokens:PATH");
  if (!spec.token_sequences)
    fail("--data text:PATH is text, for " + models_for(true) + "; --model " + c.model + " needs --data fashion-mnist");
  if (c.vocab_size < 256)
    fail("--data text:PATH trains on bytes (ids 0-255): --vocab-size " + std::to_string(c.vocab_size) +
         " is too small (use 256)");
  std::error_code error;
  if (!fs::exists(path, error)) fail("--data text:" + path + ": no such file or folder");
}

// A file the run writes (--metrics, --trace): its folder must exist, and it must not be one.
void check_output_file(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent))
    fail(flag + " " + path + ": the folder " + parent.string() + " does not exist");
  if (fs::is_directory(path)) fail(flag + " " + path + " is a folder; give a file path");
}

void check_checkpoint_flags(const TrainConfig& c) {
  namespace fs = std::filesystem;
  if (c.checkpoint_every < 0) fail("--checkpoint-every must be >= 0 steps (0: only at the end), got " + std::to_string(c.checkpoint_every));
  if (c.keep_last < 0) fail("--keep-last must be >= 0 (0: keep every checkpoint), got " + std::to_string(c.keep_last));
  if (c.checkpoint_dir.empty()) {
    if (c.resume) fail("--resume continues from a checkpoint in --checkpoint-dir DIR: give the folder");
    if (c.checkpoint_every > 0) fail("--checkpoint-every needs --checkpoint-dir DIR (where to write them)");
    if (c.checkpoint_async) fail("--checkpoint-async writes checkpoints in the background: it needs --checkpoint-dir DIR");
    return;
  }
  // The folder itself may not exist yet (it is created), but what is there
  // must be a folder, and its parent must exist.
  std::error_code error;
  const fs::path dir(c.checkpoint_dir);
  if (fs::exists(dir, error) && !fs::is_directory(dir, error))
    fail("--checkpoint-dir " + c.checkpoint_dir + " is a file; give a folder");
  fs::path absolute = fs::absolute(dir, error).lexically_normal();
  if (!absolute.has_filename()) absolute = absolute.parent_path();  // "ckpt/" -> "ckpt"
  const fs::path parent = absolute.parent_path();
  if (!fs::exists(dir, error) && !fs::is_directory(parent, error))
    fail("--checkpoint-dir " + c.checkpoint_dir + ": the folder " + parent.string() + " does not exist");
}


// The run features a strategy's row says no to (Note [the strategy table]).
// Every row says yes today; a strategy that cannot offer one says so in its
// row, and its reason belongs in these messages.
void check_features(const TrainConfig& c, const StrategyInfo& row) {
  auto refuse = [&](const std::string& feature) {
    fail(feature + " is not available with --strategy " + c.strategy + " (" + row.description + "): leave it out");
  };
  if (c.grad_clip > 0 && !row.grad_clip) refuse("--grad-clip");
  if (c.on_nonfinite == "skip" && !row.nonfinite_skip) refuse("--on-nonfinite skip");
  if (!c.trace_path.empty() && !row.trace) refuse("--trace");
  if ((!c.checkpoint_dir.empty() || c.resume) && !row.checkpoints) refuse("--checkpoint-dir and --resume");
  // The parameter server's servers save on their own threads, between
  // requests (Note [parameter-server checkpoints]): not staged yet.
  if (c.checkpoint_async && row.engine == StrategyEngine::ParameterServer)
    fail("--checkpoint-async is not available with --strategy " + c.strategy +
         " (the parameter server saves in its servers' loop): leave it out");
}

// --servers, --staleness, --backup-workers, --slow-rank, --balance (issue 7).
void check_ps_and_straggler_flags(const TrainConfig& c, int world_size) {
  const StrategyInfo& row = strategy_info(c.strategy);
  const bool ps = row.engine == StrategyEngine::ParameterServer;
  auto names = [](bool (*keep)(const StrategyInfo&)) {  // "ddp or ps-sync", "ps-sync, ps-async or ps-ssp"
    std::string list = strategy_list(keep);
    const size_t last = list.rfind(", ");
    return last == std::string::npos ? list : list.replace(last, 2, " or ");
  };
  if (ps) {
    if (c.servers < 1 || c.servers >= world_size)
      fail("--servers " + std::to_string(c.servers) + " must be at least 1 and leave at least one worker among the " +
           std::to_string(world_size) + " ranks (--nproc = workers + servers)");
    if (c.staleness < 0) fail("--staleness must be >= 0 steps, got " + std::to_string(c.staleness));
    // Only lockstep without backup workers keeps the workers together, so
    // only there can they meet in a collective mid-run.
    const bool lockstep = row.synchrony == Synchrony::Lockstep && c.backup_workers == 0;
    if (c.eval_every > 0 && !lockstep)
      fail("--eval-every evaluates in lockstep, which would hold back --strategy " + c.strategy +
           (c.backup_workers > 0 ? " with --backup-workers" : "") +
           ": leave it out (the run evaluates once at the end)");
    if (c.balance && c.backup_workers > 0)
      fail("--balance and --backup-workers are two answers to one straggler: a backup worker may skip the step "
           "at which the workers agree on the new split; give one of them");
    const int workers = world_size - c.servers;
    if (c.backup_workers < 0 || (c.backup_workers > 0 && c.backup_workers >= workers))
      fail("--backup-workers " + std::to_string(c.backup_workers) + " must be at least 0 and below the " +
           std::to_string(workers) + " workers");
    // Note [backup workers]: each server takes its own first W - k pushes,
    // so two servers may close a step with different workers; they then
    // cannot agree on a checkpoint's step, a step's norm or a skip.
    if (c.backup_workers > 0 && c.servers > 1 &&
        (!c.checkpoint_dir.empty() || c.grad_clip > 0 || c.on_nonfinite == "skip"))
      fail("--backup-workers with --servers " + std::to_string(c.servers) +
           ": each server closes a step with its own first workers, so the servers cannot agree on a "
           "checkpoint, --grad-clip or --on-nonfinite skip; use --servers 1 or leave those out");
    if (c.batch_size < workers)
      fail("--batch-size " + std::to_string(c.batch_size) + " is the global batch, split over " +
           std::to_string(workers) + " workers: it must be at least the number of workers");
  } else if (c.servers != 1 || c.staleness != 2) {
    fail("--servers and --staleness configure the parameter server: they need --strategy " +
         names([](const StrategyInfo& r) { return r.engine == StrategyEngine::ParameterServer; }) + ", not " +
         c.strategy);
  }
  if (c.backup_workers != 0 && !row.backup_workers)
    fail("--backup-workers needs --strategy " + names([](const StrategyInfo& r) { return r.backup_workers; }) + ": " +
         std::string(ps ? "in " + c.strategy + " no step waits for all workers anyway"
                        : "an all-reduce cannot proceed without the late rank, so with --strategy " + c.strategy +
                              " every step waits for the slowest; ps-sync servers can apply a step without it"));
  if (c.balance && !row.balance)
    fail("--balance re-splits the global batch of synchronous data parallelism: it needs --strategy " +
         names([](const StrategyInfo& r) { return r.balance; }) + ", not " + c.strategy);
  if (c.slow_rank >= world_size)
    fail("--slow-rank " + std::to_string(c.slow_rank) + ": there is no such rank among the " +
         std::to_string(world_size) + " (ranks are 0.." + std::to_string(world_size - 1) + ")");
  if (c.slow_rank >= 0 && !(c.slow_factor >= 1.0))
    fail("--slow-rank R:FACTOR needs FACTOR >= 1 (2 = twice as slow), got " + std::to_string(c.slow_factor));
  if (c.slow_rank >= 0 && ps && c.slow_rank >= world_size - c.servers)
    fail("--slow-rank " + std::to_string(c.slow_rank) + " is a server (the last " + std::to_string(c.servers) +
         " ranks): slow down a worker, 0.." + std::to_string(world_size - c.servers - 1));
}
// --tp N: a (dp, tp) mesh of GPT ranks (dtrain/tp_gpt.h). What it does not
// combine with yet is refused here, naming the flag.
void check_tensor_parallel_flags(const TrainConfig& c, const ModelSpec& spec, int world_size) {
  if (c.tp < 1) fail("--tp must be >= 1, got " + std::to_string(c.tp));
  if (c.sequence_parallel && c.tp == 1)
    fail("--sequence-parallel splits tensor parallelism's activations along the sequence: it needs --tp N with N > 1");
  if (c.tp == 1) return;
  const std::string tp = "--tp " + std::to_string(c.tp);
  if (!spec.tensor_parallel)
    fail(tp + " needs ModelSpec::tensor_parallel, the model's split into tensor-parallel layers, which --model " +
         c.model + "'s spec does not have");
  if (world_size % c.tp != 0)
    fail(tp + " does not divide the " + std::to_string(world_size) + " ranks (--nproc): the ranks form a (dp, tp) "
         "mesh with dp = ranks / tp");
  if (c.sequence_parallel && c.seq_len % c.tp != 0)
    fail("--sequence-parallel with " + tp + " needs --seq-len divisible by " + std::to_string(c.tp) + ", got " +
         std::to_string(c.seq_len));
  if (c.vocab_size % c.tp != 0)
    fail(tp + " does not divide the vocabulary of " + std::to_string(c.vocab_size) + " (--vocab-size; each rank holds "
         "vocab / tp rows of the embedding)");
  if (!one_of(c.strategy, {"single", "ddp", "zero1", "zero2", "fsdp", "hsdp"}))
    fail(tp + " combines with --strategy single, ddp, zero1, zero2, fsdp or hsdp (over the dp groups), not " +
         c.strategy);
  if (c.compress != "none") fail(tp + " does not work with --compress " + c.compress + " yet");
  if (c.balance) fail(tp + " does not work with --balance (the tp ranks of a dp group share one batch part)");
}

// --cp N: every sequence split over N ranks (dtrain/context_parallel.h).
// What it does not combine with yet is refused here, naming the flag.
void check_context_parallel_flags(const TrainConfig& c, const ModelSpec& spec, int world_size) {
  if (c.cp < 1) fail("--cp must be >= 1, got " + std::to_string(c.cp));
  if (c.cp == 1) return;
  const std::string cp = "--cp " + std::to_string(c.cp);
  if (!spec.context_parallel)
    fail(cp + " needs a model that runs on sequence shards (ModelSpec::context_parallel: its positions from "
         "models::sequence_positions, its attention from models::causal_attention), which --model " + c.model +
         "'s spec does not declare");
  const int others = c.pp * c.cp * c.tp;
  if (world_size % others != 0)
    fail(cp + (c.pp > 1 ? " x --pp " + std::to_string(c.pp) : std::string()) +
         (c.tp > 1 ? " x --tp " + std::to_string(c.tp) : std::string()) + " does not divide the " +
         std::to_string(world_size) + " ranks (--nproc): the ranks form a (dp, pp, cp, tp) mesh with dp = ranks / " +
         std::to_string(others));
  if (c.seq_len % (2 * c.cp) != 0)
    fail(cp + " needs --seq-len divisible by " + std::to_string(2 * c.cp) + " (each rank holds a head and a tail "
         "chunk of 2 x cp equal chunks), got " + std::to_string(c.seq_len));
  if (c.sequence_parallel && (c.seq_len / c.cp) % c.tp != 0)
    fail("--sequence-parallel with " + cp + " and --tp " + std::to_string(c.tp) + " splits each rank's " +
         std::to_string(c.seq_len / c.cp) + " tokens over tp: it needs --seq-len divisible by " +
         std::to_string(c.cp * c.tp));
  if (c.dropout > 0)
    fail(cp + " with --dropout " + std::to_string(c.dropout) + " is not available: one process's dropout masks "
         "over whole sequences are not drawn on shards; use --dropout 0");
  if (!one_of(c.strategy, {"ddp", "zero1", "zero2", "fsdp", "hsdp"}))
    fail(cp + " combines with --strategy ddp, zero1, zero2, fsdp or hsdp (over dp x cp: the cp ranks' gradients are "
         "summed like data-parallel ranks'), not " + c.strategy);
  if (c.compress != "none") fail(cp + " does not work with --compress " + c.compress + " yet");
  if (c.balance) fail(cp + " does not work with --balance (the cp ranks of a dp group share one batch part)");
}

}  // namespace

void check_pipeline_schedule(const TrainConfig& c) {
  if (!one_of(c.schedule, {"1f1b", "gpipe", "interleaved"}))
    fail("--schedule '" + c.schedule + "' is not one of: 1f1b, gpipe, interleaved");
  if (c.virtual_stages < 1) fail("--virtual-stages must be >= 1, got " + std::to_string(c.virtual_stages));
  if (c.schedule == "interleaved" && c.virtual_stages < 2)
    fail("--schedule interleaved runs several model chunks per pipeline rank: it needs --virtual-stages V with V >= 2");
  if (c.virtual_stages > 1 && c.schedule != "interleaved")
    fail("--virtual-stages " + std::to_string(c.virtual_stages) + " needs --schedule interleaved (" + c.schedule +
         " runs one stage per rank)");
  if (c.virtual_stages == 1) return;
  if (c.pp <= 1) fail("--virtual-stages splits the model into chunks per pipeline rank: it needs --pp N with N > 1");
  if (c.microbatches % c.pp != 0)
    fail("--schedule interleaved runs the microbatches in groups of --pp " + std::to_string(c.pp) +
         ": --microbatches " + std::to_string(c.microbatches) + " is not a multiple of " + std::to_string(c.pp));
}

namespace {

// --pp N: a (dp, pp) mesh of GPT stages (dtrain/pipeline.h). What it does
// not combine with yet is refused here, naming the flag.
void check_pipeline_flags(const TrainConfig& c, const ModelSpec& spec, int world_size) {
  if (c.pp < 1) fail("--pp must be >= 1, got " + std::to_string(c.pp));
  if (c.microbatches < 1) fail("--microbatches must be >= 1, got " + std::to_string(c.microbatches));
  check_pipeline_schedule(c);
  if (!one_of(c.pp_gather, {"step", "microbatch"})) fail("--pp-gather '" + c.pp_gather + "' is not one of: step, microbatch");
  if (c.pp == 1) {
    if (c.microbatches > 1)
      fail("--microbatches splits a pipeline's batch between its stages: it needs --pp N with N > 1");
    if (c.pp_gather != "step") fail("--pp-gather says how a pipeline stage gathers its units: it needs --pp N with N > 1");
    return;
  }
  const std::string pp = "--pp " + std::to_string(c.pp);
  if (!spec.pipeline_stage)
    fail(pp + " needs ModelSpec::pipeline_stage, the model's division into stages, which --model " + c.model +
         "'s spec does not have");
  if (world_size % (c.pp * c.tp) != 0 && c.cp == 1)
    fail(pp + (c.tp > 1 ? " x --tp " + std::to_string(c.tp) : std::string()) + " does not divide the " +
         std::to_string(world_size) + " ranks (--nproc): the ranks form a " +
         (c.tp > 1 ? "(dp, pp, tp) mesh with dp = ranks / (pp x tp)" : "(dp, pp) mesh with dp = ranks / pp"));
  if (!one_of(c.strategy, {"single", "ddp", "zero1", "zero2", "fsdp", "hsdp"}))
    fail(pp + " combines with --strategy single, ddp, zero1, zero2, fsdp or hsdp (over the dp groups), not " +
         c.strategy);
  if (c.compress != "none") fail(pp + " does not work with --compress " + c.compress + " yet");
  if (c.pp_gather != "step" && !one_of(c.strategy, {"zero1", "zero2", "fsdp", "hsdp"}))
    fail("--pp-gather " + c.pp_gather + " says when a sharded strategy gathers a stage's units: it needs --strategy "
         "zero1, zero2, fsdp or hsdp, not " + c.strategy);
  if (c.balance) fail(pp + " does not work with --balance (a batch part splits into equal microbatches)");
  const int dp = world_size / (c.pp * c.cp * c.tp);
  if (c.batch_size % (static_cast<int64_t>(dp) * c.microbatches) != 0)
    fail("--batch-size " + std::to_string(c.batch_size) + " must split into " + std::to_string(dp) +
         (dp == 1 ? " data-parallel group" : " data-parallel groups") + " x --microbatches " +
         std::to_string(c.microbatches) + " equal microbatches (a multiple of " +
         std::to_string(dp * c.microbatches) + ")");
}

// --activation-checkpointing on (the strategy is checked with the others:
// train::check_strategy): what FSDP's recompute covers in this run.
// --fp8: a model whose layers call dtrain::linear, split no further than
// the weights every rank holds whole (a tp slice's tensorwise scale would
// be its slice's, not the layer's).
void check_float8(const TrainConfig& c, const ModelSpec& spec) {
  if (c.fp8 == "off") return;
  parse_float8_scaling(c.fp8);  // names the choices
  if (c.fp8_min_width < 0) fail("--fp8-min-width must be >= 0, got " + std::to_string(c.fp8_min_width));
  if (!spec.float8_layers)
    fail("--fp8 " + c.fp8 + ": --model " + c.model +
         "'s layers do not go through dtrain::linear (ModelSpec::float8_layers, dtrain/float8.h); call it in the "
         "model's forward, or use --fp8 off");
  if (c.tp > 1)
    fail("--fp8 with --tp " + std::to_string(c.tp) +
         " is not available yet: a tensor-parallel slice's scales would need the amax over its tp group; use --tp 1 "
         "(fsdp, pp and cp take --fp8)");
}

void check_activation_checkpointing(const TrainConfig& c, const ModelSpec& spec, const torch::Device& device) {
  if (!c.activation_checkpointing) return;
  const std::string flag = "--activation-checkpointing on";
  // Only units other than the root are recomputed (FSDPOptions::
  // activation_checkpointing); a model without declared blocks is one unit, the root.
  if (!spec.checkpointable_blocks)
    fail(flag + " recomputes the model's blocks (its FSDP units) in their backward: it needs a model whose spec "
         "declares them (ModelSpec::checkpointable_blocks); --model " + c.model +
         " is a single unit, the root, which keeps its activations");
  if (c.tp > 1)
    fail(flag + " with --tp " + std::to_string(c.tp) + " is not available yet: leave one of them out");
  // A stage's units are gathered for the whole step (FullyShardedBase::
  // gather_for_step), where FSDP runs them as they are, without the recompute.
  if (c.pp > 1)
    fail(flag + " with --pp " + std::to_string(c.pp) + " is not available yet (a pipeline stage runs its units "
         "gathered for the whole step, without the recompute): leave one of them out");
  // The recompute restores the GPU's generator too now
  // (src/fsdp/activation_checkpoint.cpp), but that has not run on a GPU yet:
  // the refusal stays until CudaTraining.ActivationCheckpointingReplaysGpuDropout
  // (tests/cuda, run by scripts/device/gpu_check.sh) has passed there, since
  // other masks in the recompute would give wrong gradients without a word.
  if (c.dropout > 0 && device.is_cuda())
    fail(flag + " with --dropout on a GPU is not available yet: the recompute's replay of the GPU's dropout masks "
         "awaits its first GPU test; use --dropout 0 or --device cpu");
}

}  // namespace

void check_train_config(const TrainConfig& c, int world_size) {
  const ModelSpec& spec = find_model(c.model);  // an unknown --model: the registered ones named
  check_tensor_parallel_flags(c, spec, world_size);
  check_context_parallel_flags(c, spec, world_size);
  check_pipeline_flags(c, spec, world_size);
  // The ranks that read data: the dp groups of the mesh (--strategy runs over dp x cp).
  const int data_ranks = world_size / std::max(1, c.tp * c.pp * c.cp);
  if (spec.check) spec.check(c);
  if (!(c.dropout >= 0.0 && c.dropout < 1.0)) fail("--dropout must be in [0, 1), got " + std::to_string(c.dropout));
  if (!c.init_from.empty()) {
    namespace fs = std::filesystem;
    std::error_code error;
    if (!fs::exists(c.init_from, error)) fail("--init-from " + c.init_from + ": no such file");
    if (fs::is_directory(c.init_from, error) && !hf::is_model_directory(c.init_from))
      fail("--init-from " + c.init_from + " is a folder without config.json; give a .safetensors file or a Hugging Face "
           "model directory");
    if (hf::is_model_directory(c.init_from) && !spec.hugging_face)
      fail("--init-from " + c.init_from + " is a Hugging Face model directory, and --model " + c.model +
           "'s spec does not read one (ModelSpec::hugging_face)");
  }
  check_data(c, spec);

  // --device cuda on a machine without a GPU, or with a CPU-only strategy
  const torch::Device device = train::resolve_device(c);
  train::check_strategy({.name = c.strategy, .compress = c.compress, .mixed_precision = c.mixed_precision,
                         .reduce_dtype = c.reduce_dtype, .fsdp_prefetch = c.fsdp_prefetch,
                         .fsdp_compress = c.fsdp_compress, .activation_checkpointing = c.activation_checkpointing},
                        data_ranks * c.cp);  // the engine's ranks
  check_activation_checkpointing(c, spec, device);
  check_float8(c, spec);
  // On a GPU the ring's pairs run the memory-efficient CUDA kernel
  // (src/cp/pair_attention.cpp), which no GPU has run yet: the kit's
  // CudaTraining.RingAttentionPairsOnTheDeviceEqualFullAttention checks it
  // against full attention first.
  if (c.cp > 1 && device.is_cuda())
    fail("--cp " + std::to_string(c.cp) + " on a GPU is not available yet: ring attention's CUDA pair kernel awaits "
         "its first GPU test (tests/cuda/test_cuda_training.cpp); use --device cpu");
  check_features(c, strategy_info(c.strategy));
  check_ps_and_straggler_flags(c, world_size);

  if (c.steps < 0 || c.epochs < 0 || (c.steps > 0) == (c.epochs > 0))
    fail("give exactly one of --steps N and --epochs N (N >= 1)");
  check_positive("--batch-size", c.batch_size);
  if (c.batch_size < data_ranks)
    fail("--batch-size " + std::to_string(c.batch_size) + " is the global batch, split over " +
         std::to_string(data_ranks) + (c.tp * c.pp * c.cp > 1 ? " data-parallel groups" : " ranks") +
         ": it must be at least the number of " + (c.tp * c.pp * c.cp > 1 ? "groups" : "ranks"));

  if (!one_of(c.optimizer, {"sgd", "adamw"})) fail("--optimizer '" + c.optimizer + "' is not one of: sgd, adamw");
  if (!(c.lr > 0.0)) fail("--lr must be positive, got " + std::to_string(c.lr));
  if (!(c.momentum >= 0.0 && c.momentum < 1.0)) fail("--momentum must be in [0, 1), got " + std::to_string(c.momentum));
  if (!(c.weight_decay >= 0.0)) fail("--weight-decay must be >= 0, got " + std::to_string(c.weight_decay));
  if (c.warmup < 0) fail("--warmup must be >= 0 steps, got " + std::to_string(c.warmup));
  if (!(c.grad_clip >= 0.0)) fail("--grad-clip must be >= 0 (0: no clipping), got " + std::to_string(c.grad_clip));

  if (!one_of(c.on_nonfinite, {"stop", "skip"}))
    fail("--on-nonfinite '" + c.on_nonfinite + "' is not one of: stop, skip");
  check_checkpoint_flags(c);

  if (c.eval_every < 0) fail("--eval-every must be >= 0 (0: only at the end), got " + std::to_string(c.eval_every));
  check_positive("--log-every", c.log_every);
  if (c.eval_windows < data_ranks)
    fail("eval_windows " + std::to_string(c.eval_windows) + " must be at least the number of ranks");
  check_output_file("--metrics", c.metrics_path);
  check_output_file("--trace", c.trace_path);
}

}  // namespace dtrain
