// Training runs: what `dtrain train` does on every rank, as a library call.
//
//   auto world = dtrain::init(argc, argv);
//   dtrain::TrainConfig config;          // model, data, strategy, optimizer, schedule, ...
//   config.model = "gpt";
//   config.data = "text:/usr/share/games/fortunes";
//   config.strategy = "ddp";
//   auto result = dtrain::run_training(config, world);   // every rank calls it
//
// Every rank builds the same model (torch::manual_seed(seed) first), wraps it
// for the strategy, and trains on its part of each global batch
// (data::DistributedSampler). The loss it reports is the global batch's mean
// loss, identical on every rank, and the result is the same, up to floating-
// point rounding, for any number of ranks (see Note [global batch loss] in
// src/train/trainer.cpp). Rank 0 prints progress and writes the metrics file.
#pragma once

#include <dtrain/comm.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtrain {

struct TrainConfig {
  // ---- model: a name in the model registry (dtrain/model_spec.h). Built
  // in: mlp | cnn | gpt (dtrain's byte-level GPT) | gpt2 (GPT-2: the GPT
  // with the tanh GELU) | llama (models::Llama); a program adds its own with
  // dtrain::register_model. The sizes below are the built-ins'; a model of
  // one's own reads what it needs from model_options.
  std::string model = "mlp";
  // --model-option KEY=VALUE: settings for a registered model of one's own
  // (its spec reads them; dtrain only keeps them in checkpoints' run description).
  std::map<std::string, std::string> model_options;
  std::vector<int64_t> mlp_hidden{256, 256};
  // The transformers' sizes (gpt, gpt2, llama): blocks, width, query heads.
  int64_t gpt_layers = 4;
  int64_t gpt_dim = 128;
  int64_t gpt_heads = 4;
  int64_t seq_len = 128;  // the training windows' length
  double dropout = 0.0;
  // llama: key/value heads (grouped-query attention; 0 = gpt_heads), the
  // SwiGLU MLP's width (0 = models::default_ffn_dim), rotary base, tied head.
  int64_t kv_heads = 0;
  int64_t ffn_dim = 0;
  double rope_theta = 10000.0;
  bool tie_embeddings = false;
  // The normalisation's epsilon; 0 = the family's (1e-5 LayerNorm, 1e-6 RMSNorm).
  double norm_eps = 0.0;
  // gpt2, llama: the longest context the model holds (GPT-2's position
  // table); 0 = seq_len.
  int64_t positions = 0;
  // A Hugging Face config.json the transformer's architecture comes from
  // (apply_model_config sets the fields above from it); "" = the flags.
  // The file's text is kept in checkpoints for `dtrain checkpoint export
  // --format hf`.
  std::string model_config;
  std::string model_config_json;
  // GPT: token ids 0..vocab_size-1 (256: the bytes of --data text:PATH; a
  // token file's ids must fall below it).
  int64_t vocab_size = 256;
  // Initial weights from a safetensors file (every parameter and buffer, by
  // name; see load_state_into in dtrain/checkpoint.h) or a Hugging Face model
  // directory (a model with ModelSpec::hugging_face: dtrain/hugging_face.h) instead of the seeded
  // initialisation; "" = none. Each rank reads only what it holds.
  std::string init_from;

  // ---- data: "fashion-mnist" (mlp, cnn), "text:PATH" (gpt; a file or a
  // folder) or "tokens:PATH" (gpt; a token file, or a folder with a train and
  // a validation file: data::read_token_corpus)
  std::string data = "fashion-mnist";
  std::string token_dtype = "auto";  // tokens:PATH: auto | uint16 | uint32 (data::TokenFormat)
  std::string fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";
  bool shuffle = true;

  // ---- device (src/train/device.h)
  // "cpu", "cuda" (rank r on cuda:LOCAL_RANK, modulo the GPUs) or "auto"
  // (cuda when this build and machine have a GPU, else cpu).
  std::string device = "auto";
  // CUDA: let fp32 matmuls and convolutions use TF32 tensor cores (faster,
  // 10-bit mantissa products); false: full fp32.
  bool tf32 = true;
  // CUDA: FSDP's and DDP's collectives on streams of their own, so they
  // overlap with compute (FSDPOptions/DDPOptions::comm_streams); false: on
  // the compute stream (to measure what the streams buy).
  bool comm_streams = true;
  // The hardware's peak TFLOP/s for the compute dtype, the denominator of
  // MFU; 0 = measured once per machine by a GEMM probe (src/train/peak_flops.h).
  double peak_tflops = 0;

  // ---- parallelism: see strategy_names(); compress applies to ddp
  std::string strategy = "ddp";
  // Tensor parallelism (ModelSpec::tensor_parallel): the ranks form a (dp, tp)
  // mesh, tp consecutive ranks split each block (dtrain/tp_gpt.h,
  // dtrain/tp_llama.h) and --strategy runs over the
  // dp = world / tp groups; 1 = none.
  int tp = 1;
  // With tp > 1: split the activations outside attention and the MLP along
  // the sequence too (dtrain/tp_gpt.h); seq_len must be a multiple of tp.
  bool sequence_parallel = false;
  // Pipeline parallelism (ModelSpec::pipeline_stage): pp consecutive groups of ranks hold
  // consecutive stages of the blocks (dtrain/pipeline.h); the mesh is
  // (dp, pp, tp). Each rank's part of the batch runs as `microbatches`
  // microbatches under `schedule` ("1f1b" | "gpipe" | "interleaved").
  // "interleaved" (interleaved 1F1B): each rank holds `virtual_stages`
  // chunks of the model (stages rank, rank + pp, ... of pp x
  // virtual_stages); the spec's pipeline_stage is called once per chunk
  // (dtrain::pipeline_place, dtrain/model_spec.h). microbatches must be a
  // multiple of pp.
  int pp = 1;
  // Context parallelism (ModelSpec::context_parallel): every sequence split
  // over cp ranks, head and tail chunks each (dtrain/context_parallel.h);
  // attention runs as ring attention. The mesh is (dp, pp, cp, tp) and
  // --strategy runs over dp x cp (the cp ranks hold the same parameters).
  // seq_len must be a multiple of 2 x cp. cp_overlap false: each ring step
  // waits for its block before computing (to measure the exposed time).
  int cp = 1;
  bool cp_overlap = true;
  int microbatches = 1;
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  // With pp and a sharded strategy: "step" gathers each stage's units once
  // per step, "microbatch" for every microbatch's forward and backward
  // (FullyShardedBase::gather_for_step).
  std::string pp_gather = "step";
  std::string compress = "none";  // none | bf16 | powersgd | topk
  // "bf16": compute in bf16 while the optimizer updates fp32 master weights
  // (every strategy but the parameter server's; dtrain/mixed_precision.h);
  // gradients are reduced in reduce_dtype ("fp32" | "bf16").
  std::string mixed_precision = "none";
  std::string reduce_dtype = "fp32";
  // --fp8: the linear layers a model calls through dtrain::linear (the
  // built-in transformers' blocks; ModelSpec::float8_layers) multiply in fp8:
  // "off" | "tensorwise" | "rowwise" (Note [float8 recipes] in
  // dtrain/float8.h; docs/fp8.md). Layers whose K N / (K + N) is below
  // fp8_min_width stay as they are (Note [which layers run in fp8]).
  std::string fp8 = "off";
  int64_t fp8_min_width = 1024;
  // --fp8 tensorwise under zero1/zero2/fsdp/hsdp: the weights dtrain::linear
  // multiplies in fp8 are all-gathered as fp8 from the second step (Note
  // [float8 all-gather] in src/fsdp/float8_gather.cpp; bitwise the same
  // training, a byte per element on the wire).
  bool fp8_all_gather = true;
  // zero1 / zero2 / fsdp / hsdp: prefetch the next unit's all-gather "on",
  // "off", or "auto" (measure both in the first steps and keep the faster;
  // Note [prefetch tuning] in src/fsdp/prefetch_tuner.h).
  std::string fsdp_prefetch = "auto";
  // Sharded strategies: compressed all-gathers / reduce-scatters,
  // "params=int8,grads=bf16,block=256" (dtrain/fsdp_compression.h); "none".
  std::string fsdp_compress = "none";
  // zero1 / zero2 / fsdp / hsdp with a transformer (gpt, gpt2, llama): each
  // block (an FSDP unit) keeps only its input from forward to backward and
  // recomputes its forward in its backward (FSDPOptions::
  // activation_checkpointing): less activation memory, one more forward of
  // the blocks per step.
  bool activation_checkpointing = false;
  // `dtrain train --parallel auto`: the layout flags `dtrain plan --search`
  // chose and its predicted step time, for the banner and the metrics'
  // final line ("" and 0: the layout was given by hand).
  std::string parallel_auto;
  double parallel_auto_predicted_step_s = 0;

  // ---- parameter server and stragglers (issue 7; src/train/ps_training.h, src/train/stragglers.h)
  int servers = 1;          // ps-*: the last S ranks serve; the other W = nproc - S train
  int staleness = 2;        // ps-ssp: a worker runs at most this many steps ahead of the slowest
  int backup_workers = 0;   // ps-sync: each step uses the first W - k gradients
  int slow_rank = -1;       // --slow-rank R:FACTOR: rank R sleeps (FACTOR - 1) x its compute time
  double slow_factor = 1.0;
  bool balance = false;     // ddp, ps-sync: re-split the global batch by measured throughput

  // ---- length: exactly one of steps and epochs is positive
  int64_t steps = 0;
  int64_t epochs = 0;
  int64_t batch_size = 128;  // global: samples per step over all ranks

  // ---- optimisation
  std::string optimizer = "sgd";  // sgd | adamw
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 0.0;
  int64_t warmup = 0;       // steps of linear warmup; then cosine decay to 10% of lr
  double grad_clip = 0.0;   // global gradient norm limit; 0 = no clipping
  uint64_t seed = 0;
  // A step whose loss (or, with grad_clip, gradient norm) is NaN or infinite:
  // "stop" ends the run with an error naming the step; "skip" leaves the
  // weights and optimizer state as they were and goes on with the next batch.
  std::string on_nonfinite = "stop";

  // ---- checkpoints (src/train/checkpointing.h; "" = none)
  // DIR/step-NNNNNNNN/ every checkpoint_every steps (0: only at the end, and
  // on SIGINT/SIGTERM, which then stop the run at the next step boundary).
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int64_t keep_last = 2;     // checkpoints kept in checkpoint_dir; 0 = all
  // Write checkpoints in the background: the step that saves copies its
  // state to host memory and goes on (src/train/background_checkpoints.h).
  bool checkpoint_async = false;
  // Continue from the newest complete checkpoint in checkpoint_dir (any
  // strategy, any world size); none there: start at step 0.
  bool resume = false;
  // Testing aid: rank 0's loss becomes NaN at this step (1-based; 0 = never).
  int64_t debug_nan_at_step = 0;

  // ---- evaluation and output
  int64_t eval_every = 0;   // steps between evaluations; 0 = only at the end
  int64_t eval_windows = 256;  // GPT: validation windows per evaluation (the split's first ones)
  int64_t log_every = 10;
  std::string metrics_path;  // JSON Lines; "" = none
  // Chrome trace-event JSON of every rank's timeline (dtrain/trace.h); "" = none.
  std::string trace_path;
  bool print = true;         // rank 0 prints progress and results
  // A live progress line rewritten in place, or plain lines every log_every
  // steps; unset: live when stdout is a terminal.
  std::optional<bool> live_progress;
  int64_t samples = 3;       // GPT: generated samples printed at the end
  int64_t sample_bytes = 200;  // new bytes per sample (new tokens, with a tokenizer)
  // tokens:PATH: the SentencePiece model (dtrain tokenize) that decodes the
  // samples; "" = none (then there are no samples of token ids).
  std::string tokenizer;
  std::string sample_prompt = "The ";
};

struct TrainResult {
  int64_t steps = 0;
  std::vector<double> losses;  // per step: the global batch's mean loss
  double loss = 0;             // the last step's
  std::optional<double> eval_loss;      // the final evaluation's
  std::optional<double> eval_accuracy;  // classification only
  int world_size = 1;
  double step_time_s_median = 0;
  // Tracking allocator's peak (dtrain/memory.h) over the whole run, datasets
  // not counted: the larger of the start's and the steps' peaks.
  std::vector<int64_t> peak_memory_bytes_per_rank;
  int64_t peak_memory_bytes = 0;  // max over ranks
  // Building the model, --init-from and --resume (max over ranks).
  int64_t construction_peak_bytes = 0;
  // The training steps, evaluation and checkpoints (max over ranks).
  int64_t step_peak_bytes = 0;
  int64_t peak_rss_bytes = 0;     // max over ranks (VmHWM)
  std::vector<std::string> samples;  // GPT: generated text (whole bytes, prompt included)
  int64_t resumed_from_step = 0;     // the checkpoint's step; 0 = started afresh
  int64_t skipped_steps = 0;         // on_nonfinite "skip": steps not applied
  // Restarts by the launcher (--max-restarts) before this attempt, and the
  // steps they lost (done, then redone from an older checkpoint); both 0
  // without restarts. From DTRAIN_RESTART_COUNT / DTRAIN_STEPS_LOST.
  int64_t restarts = 0;
  int64_t steps_lost = 0;
  // SIGINT or SIGTERM stopped the run after `steps` (a checkpoint was saved);
  // 0 = it ran to the end.
  int stopped_by_signal = 0;
  // FSDP strategies: whether steps prefetched ("on" / "off"; "" for other
  // strategies) and, with --fsdp-prefetch auto, the median steps that chose
  // it (slowest rank; 0 without tuning).
  std::string fsdp_prefetch;
  double prefetch_with_s = 0;
  double prefetch_without_s = 0;
};

// Runs the training described by `config` on this rank of `world`; every
// rank of `world` must call it with the same config. Throws
// std::invalid_argument for a config it cannot run (naming the field),
// std::runtime_error for data that cannot be read.
TrainResult run_training(const TrainConfig& config, CommPtr world);

// Throws std::invalid_argument when `config` cannot train on `world_size`
// ranks, naming the setting as `dtrain train` spells it (--batch-size, ...)
// and what it accepts. Checks that the data and the metrics file's folder
// exist (and the --init-from file), without reading them. run_training()
// calls it first.
void check_train_config(const TrainConfig& config, int world_size);
// --schedule and --virtual-stages against --pp and --microbatches: the part
// of check_train_config that `dtrain plan` shares. Throws
// std::invalid_argument naming the flag.
void check_pipeline_schedule(const TrainConfig& config);

// Fills in the model and its architecture from a Hugging Face config.json:
// config.model_config, or else config.init_from's when that is a model
// directory (dtrain/hugging_face.h); nothing without either. Sets model to
// the registered model the file describes (model_for_hugging_face,
// dtrain/model_spec.h; a different one in config.model is an error), the
// fields its adapter's read_config sets (sizes, positions, ...), and
// model_config_json. Throws std::invalid_argument naming the file and field
// the model cannot be built from. run_training() calls it on its copy of the config.
void apply_model_config(TrainConfig& config);
// The config.json apply_model_config reads: config.model_config, else
// config.init_from's when that is a model directory; "" for none.
std::string model_config_path(const TrainConfig& config);
// Whether --model names a registered model that trains on token sequences
// (ModelSpec::token_sequences: text and token data, samples at the end).
bool is_language_model(const std::string& model);

// Throws std::invalid_argument naming --init-from unless config.init_from is
// empty or a safetensors file that fits config's model (every parameter and
// buffer, by name, shape and dtype). Builds the model once and reads the
// whole file; `dtrain train` calls it, after check_train_config, before
// starting any rank.
void check_init_from(const TrainConfig& config);

// The values TrainConfig::strategy may name, in the order to show them, and
// whether this build can train with one yet.
std::vector<std::string> strategy_names();
bool strategy_available(const std::string& strategy);

// --slow-rank "R:FACTOR" -> {R, FACTOR}; throws std::invalid_argument naming
// the flag for anything else. check_train_config checks the values.
std::pair<int, double> parse_slow_rank(const std::string& text);

}  // namespace dtrain
