// Memory and communication planning: what one rank will hold at its peak,
// and what it will send per step, before anything is allocated.
//
//   auto model = dtrain::plan::describe_gpt(config, /*batch_per_rank=*/2, torch::kFloat32);
//   dtrain::plan::PlanOptions options;
//   options.engine = dtrain::plan::Engine::FSDP;
//   options.fsdp.strategy = dtrain::Sharding::Full;
//   options.world_size = 4;
//   auto plan = dtrain::plan::make_plan(model, options);
//   plan.peak.total();            // bytes at this rank's busiest moment
//   plan.wire_bytes_per_step;     // what it sends per optimizer step
//
// The model is a list of units with parameter sizes and activation sizes
// (describe_* compute them from the configuration with formulas, never by
// building the model). make_plan replays one steady-state training step
// (forward, backward, optimizer step) event by event as the engines run it,
// adding and removing bytes, and reports the largest moment with its
// breakdown. How each term follows the engine's code: Note [memory plan] in
// src/plan/simulate_step.cpp. `dtrain plan` is the command line over this.
#pragma once

#include <dtrain/float8.h>
#include <dtrain/fsdp.h>
#include <dtrain/models.h>
#include <dtrain/pipeline.h>

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::models {
struct LlamaConfig;  // dtrain/llama.h
}  // namespace dtrain::models

namespace dtrain::plan {

// ------------------------------------------------------------ the model

struct ParameterSpec {
  std::string name;  // as in module->named_parameters()
  int64_t numel = 0;
  // A weight [linear_out, linear_in] the model multiplies through
  // dtrain::linear, which --fp8 takes where float8_eligible says
  // (dtrain/float8.h); 0: not one.
  int64_t linear_in = 0, linear_out = 0;
};

// One FSDP unit: a module whose parameters are gathered and reduced together
// (a GPT block), or the root (every parameter outside the other units).
struct UnitSpec {
  std::string name;  // qualified module name; "" for the root
  std::vector<ParameterSpec> parameters;  // registration order (the flat buffer's order)
  // Bytes the unit's forward saves for its backward at the planned batch
  // (for the root: what it saves before its first child runs, e.g. the
  // embeddings' sum).
  int64_t activation_bytes = 0;
  // Transient bytes on top of those when its backward starts (gradients of
  // activations, kernels' scratch).
  int64_t backward_workspace_bytes = 0;
  // Elements of its parameters' gradients already computed when that
  // workspace peaks (CNN: the linear layers', before the convolutions').
  int64_t gradients_at_workspace_peak = 0;
  // Transient bytes when its backward ends: its activations are gone, its
  // parameters' gradients not yet final (GPT root: the embeddings' backward).
  int64_t backward_end_workspace_bytes = 0;
  // With activation checkpointing (FSDPOptions::activation_checkpointing;
  // units other than the root): what stays of its forward until its
  // backward recomputes it, counted as activation_bytes counts it: its
  // output, which the next unit's recompute keeps as its input (or the
  // root's tail saves). Its backward then holds activation_bytes again.
  // 0: not described (make_plan refuses to plan checkpointing then).
  int64_t checkpointed_activation_bytes = 0;
  // FLOPs of its forward's matrix products at the planned batch (one
  // microbatch on a pipeline stage): 2 per multiply-add, attention's scores
  // and weighted sum at what a causal kernel computes (Note [step time],
  // src/plan/step_time.cpp). Backward is twice this. 0: not described.
  double forward_flops = 0;

  int64_t numel() const;
};

// One kind of collective in one step.
struct Collective {
  std::string op;    // all_gather | reduce_scatter | all_reduce | broadcast
  std::string what;  // "parameters, forward", ...
  int group_size = 1;
  int64_t calls = 0;
  int64_t payload_bytes = 0;  // the buffers' size: the full tensor for all-gather / reduce-scatter / all-reduce
  // What this rank sends with ring algorithms: (G-1)/G of the payload for
  // all-gather and reduce-scatter, 2(G-1)/G for all-reduce.
  int64_t wire_bytes = 0;
};

struct ModelSpec {
  std::string description;       // e.g. "gpt: 14 layers, dim 768, 12 heads, seq_len 64, vocab 256"
  std::vector<UnitSpec> units;   // units[0] is the root, then the others in forward order
  int64_t batch_per_rank = 0;
  int64_t input_bytes = 0;       // one rank's batch (inputs and targets)
  int64_t root_tail_activation_bytes = 0;  // saved by the root after its last child (GPT: ln_f, head)
  // Gradients the root's tail backward produces that stay until the root's
  // own backward ends (GPT: ln_f's, and the head's contribution to wte's
  // gradient, which autograd holds until the embedding adds its own).
  int64_t root_tail_gradient_bytes = 0;
  int64_t output_bytes = 0;      // the root's output, held by the caller until the step ends
  int64_t loss_bytes = 0;        // saved by the loss for backward (log-softmax)
  int64_t buffer_bytes = 0;      // module buffers (BatchNorm statistics), replicated on every rank
  // FLOPs of the forward of the head the root's tail runs (the logits'
  // matrix product), as UnitSpec::forward_flops counts them.
  double head_forward_flops = 0;
  // Collectives the model itself issues per step (tensor parallelism's
  // activations over the tp group; payload over all calls, wire bytes left
  // for make_plan), beside the engine's over the data-parallel ranks.
  std::vector<Collective> collectives;
  // Tensor parallelism: the model is one rank's slice of a model `tensor_parallel` times
  // larger (parameter_count() counts the slice).
  int tensor_parallel = 1;
  // Pipeline parallelism (describe_gpt_stage): the model is stage `stage` of
  // `stages`, and its batch part runs as `microbatches` microbatches. The
  // units' activations and workspaces, root_tail_*, output_bytes and
  // loss_bytes are then one microbatch's (input_bytes and batch_per_rank stay
  // the part's), and each microbatch receives `message_bytes` from the stage
  // before and sends as much back as its gradient (and the same to and from
  // the stage after).
  struct PipelineStage {
    int stage = 0, stages = 1;
    int microbatches = 1;
    int64_t message_bytes = 0;
    // units[tied_unit_at] is the tied embedding's copy that the first and
    // the last stage each hold as a unit of its own (GPT's wte, a tied
    // Llama's embed_tokens): its backward is the embedding's or the head's,
    // and pp::sum_tied_gradients sums its gradients over the two. Otherwise
    // the embedding and the head are the root's.
    bool tied_unit = false;
    // Which unit that is: 1, but in the units of a rank's interleaved chunks
    // (interleave_stages), where it follows the blocks on the last rank.
    size_t tied_unit_at = 1;
    // What a stage before the last keeps of each microbatch's output beyond
    // its units' activations, until that microbatch's backward: under
    // sequence parallelism the whole activation gathered from the blocks'
    // slices (Note [sequence parallel stages], src/tp/tp_gpt_stage.cpp).
    int64_t output_bytes = 0;
    bool first() const { return stage == 0; }
    bool last() const { return stage == stages - 1; }
  } pipeline;
  // --schedule interleaved: the stage descriptions of the model chunks this
  // rank holds (its virtual stages, each a stage of ranks x V), whose units
  // `units` merges as the trainer merges the chunks' modules; `pipeline` is
  // then the rank's (stage = rank, stages = ranks). Empty otherwise.
  std::vector<ModelSpec> chunks;

  int64_t parameter_count() const;
};

// GPT as dtrain::models::GPT builds it: the root holds wte, wpe and ln_f,
// and each block (a dtrain::Sharded<GPTBlock>) is a unit. Activations for
// batch_per_rank windows of config.seq_len tokens computed in compute_dtype.
ModelSpec describe_gpt(const models::GPTConfig& config, int64_t batch_per_rank, torch::ScalarType compute_dtype);
// One rank's slice of models::TPGPT on a tensor-parallel group of `tp`
// ranks (include/dtrain/tp_gpt.h): the same units with the sliced
// parameters' local sizes, activations for batch_per_rank windows (the
// replicated ones whole, or split along the sequence with
// `sequence_parallel`), and the group's activation collectives per step.
// Plan it with make_plan at world_size = the data-parallel size. tp = 1 is
// describe_gpt. Throws std::invalid_argument when tp does not divide the
// heads or the vocabulary (or, with sequence_parallel, seq_len).
//
// cp > 1: one rank of a context-parallel group of `cp` ranks, holding T / cp
// tokens of each sequence (their head and tail chunks) and running ring
// attention (Note [ring attention plan]); plan it at world_size = dp x cp,
// the ranks the engine runs over. Throws when 2 cp does not divide seq_len.
ModelSpec describe_tp_gpt(const models::GPTConfig& config, int64_t batch_per_rank, torch::ScalarType compute_dtype,
                          int tp, bool sequence_parallel = false, int cp = 1);
// Stage `stage` of `stages` of the GPT as `dtrain train --pp` runs it:
// models::GPTStage (tp = 1) or models::TPGPTStage (one tp rank's slice),
// holding the blocks pp::divide_blocks gives it. Its units are the ones
// fully_shard builds from the stage: the root (wpe on the first stage, ln_f
// on the last, nothing in between), wte as a unit of its own on the first and
// the last stage (the tied head's copy), and one per block. Activations of
// one microbatch of batch_per_rank / microbatches windows; the tp group's
// collectives for the step's microbatches. Plan it with make_plan and
// PlanOptions::schedule at world_size = the data-parallel size. Throws
// std::invalid_argument when stages < 2, the blocks cannot fill the stages,
// or the batch does not split into the microbatches. With sequence_parallel
// (tp > 1) the blocks run on sequence slices and the stage's input and
// output stay whole (Note [sequence parallel stages]); with cp > 1 the stage
// holds T / cp tokens of each sequence and its blocks run ring attention, as
// describe_tp_gpt's.
ModelSpec describe_gpt_stage(const models::GPTConfig& config, int64_t batch_per_rank, int microbatches,
                             torch::ScalarType compute_dtype, int stage, int stages, int tp = 1,
                             bool sequence_parallel = false, int cp = 1);
// A link for the time a step's communication takes (Note [link cost],
// src/plan/link_cost.cpp): one hop of a message of n bytes takes
// latency_seconds + n / bytes_per_second.
struct Link {
  double latency_seconds = 0;
  double bytes_per_second = 0;
};
// The latencies one call of `op` over `group_size` ranks crosses with ring
// algorithms: G - 1 (all_gather, reduce_scatter, all_to_all, broadcast),
// 2 (G - 1) (all_reduce), 1 (send). Throws std::invalid_argument for another op.
int64_t latency_hops(const std::string& op, int group_size);
// Seconds `c`'s calls take on `link`: calls x latency_hops x latency +
// wire_bytes / bandwidth. Throws for a link without bandwidth.
double collective_seconds(const Collective& c, const Link& link);
// The link that fits measured (message bytes, seconds) pairs best (least
// squares of the relative error; a negative latency is taken as 0). Throws
// std::invalid_argument for fewer than two sizes, a time that is not
// positive, or times that do not grow with the size.
Link fit_link(const std::vector<std::pair<int64_t, double>>& bytes_and_seconds);

// Interleaved 1F1B (pp::Schedule::Interleaved): rank `rank` of `ranks`
// holding the model's stages rank, rank + ranks, ... of ranks x V, described
// by `chunks` in that order (describe_gpt_stage or describe_llama_stage with
// stages = ranks x V). The rank's units are the chunks' merged by name as
// the trainer merges their modules (src/train/pipeline_chunks.cpp): a unit in
// a container another chunk already filled (blocks.*, layers.*) follows that
// container's units, any other is appended. Plan it with
// PlanOptions::schedule = Interleaved; throws std::invalid_argument for
// fewer than 2 chunks or chunks that are not those stages.
ModelSpec interleave_stages(std::vector<ModelSpec> chunks, int rank, int ranks);
// Llama as dtrain::models::Llama builds it (tp = 1), or one rank's slice of
// models::TPLlama on a tensor-parallel group of `tp` ranks, optionally with
// sequence parallelism: the root holds embed_tokens, norm and the untied
// lm_head, and each of "layers.<i>" is a unit. Activations for
// batch_per_rank windows of config.seq_len tokens in compute_dtype (Note
// [llama activations], src/plan/describe_llama.cpp); the tp group's
// collectives per step. Plan it at world_size = the data-parallel size.
// Throws std::invalid_argument for a configuration Llama refuses, dropout,
// or a tp that does not divide the heads, the vocabulary or the MLP.
// cp > 1 as describe_tp_gpt's.
ModelSpec describe_llama(const models::LlamaConfig& config, int64_t batch_per_rank, torch::ScalarType compute_dtype,
                         int tp = 1, bool sequence_parallel = false, int cp = 1);
// Stage `stage` of `stages` of Llama as `dtrain train --pp` runs it
// (models::Llama or models::TPLlama with a LlamaPart), as
// describe_gpt_stage describes the GPT's: the root holds embed_tokens on the
// first stage and norm and lm_head on the last, or with a tied head
// embed_tokens is a unit of its own on both ends. sequence_parallel and cp
// as describe_gpt_stage's.
ModelSpec describe_llama_stage(const models::LlamaConfig& config, int64_t batch_per_rank, int microbatches,
                               torch::ScalarType compute_dtype, int stage, int stages, int tp = 1,
                               bool sequence_parallel = false, int cp = 1);
// MLP and CNN as dtrain::models builds them. Their root module is not a
// torch::nn::Sequential and holds no Sharded<> children, so under the default
// wrap policy the whole model is one unit: the root.
ModelSpec describe_mlp(const std::vector<int64_t>& hidden_sizes, int64_t batch_per_rank,
                       torch::ScalarType compute_dtype);
ModelSpec describe_cnn(int64_t batch_per_rank, torch::ScalarType compute_dtype);
// A model of the registry is described by its spec (dtrain/model_spec.h,
// ModelSpec::plan_description; the built-ins' call the functions above).

// ------------------------------------------------------------ the run

enum class Engine {
  DDP,   // dtrain::DistributedDataParallel (default DDPOptions)
  FSDP,  // dtrain::fully_shard with `fsdp` options
};

enum class Optimizer {
  AdamW,        // two fp32 states per parameter element (exp_avg, exp_avg_sq)
  SGDMomentum,  // one (momentum buffer)
  SGD,          // none
};
// `--optimizer adamw|sgd` with `--momentum`.
Optimizer optimizer_from(const std::string& name, double momentum);

// The rates a step's time is predicted at (Note [step time]): one rank's
// share of its device.
struct ComputeRates {
  double flops_per_second = 0;         // matrix products in the compute dtype
  double memory_bytes_per_second = 0;  // what elementwise kernels and the optimizer stream
  // The share of a collective's time that also holds up compute, overlapped
  // or not: 1 where the cores that compute also drive the transfers (a CPU
  // whose ranks' threads fill its cores), 0 where the transfers have their
  // own engine (a GPU's copy engines and NICs).
  double communication_share = 0;
  bool known() const { return flops_per_second > 0 && memory_bytes_per_second > 0; }
};

struct PlanOptions {
  Engine engine = Engine::FSDP;
  // strategy, hybrid_group_size, mixed precision, prefetch,
  // max_inflight_all_gathers, activation_checkpointing (planned for
  // describe_gpt's models; mlp and cnn have no unit to recompute)
  FSDPOptions fsdp;
  // --fp8: with tensorwise scaling and fsdp.float8_all_gather, the weights
  // ParameterSpec marks as dtrain::linear's and float8_eligible takes are
  // gathered as fp8 (Note [float8 all-gather]; the run's first step
  // gathers as without, the plan is of the steps after it).
  Float8Settings float8{};
  Optimizer optimizer = Optimizer::AdamW;
  int world_size = 1;
  // The rank to plan. Ranks differ only in how much of the padding their
  // shards hold (the last ranks hold it, and optimizer state skips it);
  // rank 0 holds the most.
  int rank = 0;
  // The weights come from a safetensors file (dtrain train --init-from):
  // DDP reads the whole file next to its replica; FSDP reads only its pieces
  // straight into them.
  bool init_from = false;
  // dtrain train --checkpoint-async: the staging buffer of this rank's
  // checkpoint pieces (src/checkpoint/staging_buffer.h) is held from the
  // first save on, so it adds to a step's memory and to between_steps.
  bool checkpoint_async = false;
  // A pipeline stage's schedule (ModelSpec::pipeline): GPipe keeps every
  // microbatch's activations until its backward, 1F1B at most stages - stage.
  pp::Schedule schedule = pp::Schedule::OneFOneB;
  // A pipeline stage under a sharded strategy: its units gathered for every
  // microbatch's forward and backward instead of once per step
  // (dtrain train --pp-gather microbatch; FullyShardedBase::gather_for_step).
  bool gather_per_microbatch = false;
  // The step's time (Plan::time) is predicted when `compute` is known and
  // every collective has a link: `link` for the engine's (over the
  // data-parallel ranks), `model_link` for the model's own (tensor, context
  // and pipeline parallelism's).
  ComputeRates compute;
  Link link;
  Link model_link;
  // Record the predicted step's spans (StepTime::spans): dtrain plan --explain.
  bool explain = false;
};

// Bytes by what they hold.
struct MemoryBreakdown {
  int64_t parameters = 0;           // the rank's own copy: shards (FSDP) or the full replica (DDP)
  int64_t gathered_parameters = 0;  // units' full parameters (all-gathered or in flight) and gather sources
  int64_t gradients = 0;            // .grad tensors: full-size while a unit's backward produces them, then shards
  int64_t reduction_buffers = 0;    // full-size gradient buffers of FSDP reductions; DDP's buckets
  int64_t optimizer_state = 0;
  int64_t activations = 0;          // saved for backward, backward workspace, inputs, output and loss
  int64_t checkpoint_staging = 0;   // --checkpoint-async: this rank's checkpoint pieces in host memory

  int64_t total() const;
};

struct UnitPlan {
  std::string name;
  int64_t numel = 0;
  int64_t padded_numel = 0;  // a multiple of the sharding group size
  int64_t shard_numel = 0;
  int64_t gathered_bytes = 0;  // its full parameters in the compute dtype (0 when never gathered)
};

// One span of a predicted step (PlanOptions::explain), as dtrain's traces
// record a measured one (Note [trace summary] in dtrain/trace_summary.h), so
// that `dtrain trace summary` reads both alike.
struct TimelineSpan {
  std::string name;
  std::string category;  // compute | wait | comm | step
  bool link = false;     // on the communication track (else the compute track)
  double start_seconds = 0, seconds = 0;
  int64_t bytes = 0;     // comm: what this rank sends
};

// A step's predicted time on one rank (Note [step time]).
struct StepTime {
  double seconds = 0;                 // forward to the optimizer step's end
  double compute_seconds = 0;         // the compute stream's work (matrix products, memory traffic, optimizer)
  double communication_seconds = 0;   // every collective's time, each as if alone on its link
  // Time the compute stream waited for the engine's collectives, plus the
  // model's own collectives, which it runs in line.
  double exposed_communication_seconds = 0;
  double bubble_seconds = 0;          // a pipeline stage's wait for its neighbours
  std::vector<TimelineSpan> spans;    // with PlanOptions::explain
  bool predicted() const { return seconds > 0; }
};

struct Plan {
  std::string strategy;  // ddp | zero1 | zero2 | fsdp | hsdp | none
  int world_size = 1;
  int shard_group_size = 1;
  int rank = 0;
  MemoryBreakdown peak;    // at the busiest moment of a steady-state step
  std::string peak_moment; // e.g. "backward: 'blocks.0' reduces its gradients"
  // At the busiest moment of the start, as dtrain train runs it: building
  // the model (sharded strategies: deferred, then materialised one module at
  // a time straight into this rank's shards; DDP: the whole model, rank 0's
  // broadcast, the buckets) and --init-from. Note [construction plan] in
  // src/plan/simulate_construction.cpp.
  MemoryBreakdown construction;
  std::string construction_moment;
  // The run's peak: the larger of the start's and a step's.
  int64_t overall_peak_bytes() const;
  MemoryBreakdown between_steps;  // after zero_grad, before the next forward
  int64_t forward_activation_bytes = 0;  // activations alive at the end of forward (the estimate for the batch)
  int max_units_gathered = 0;     // at once (full buffers allocated), over the step
  // A pipeline stage: the most microbatches whose activations it holds at
  // once (1F1B: min(stages - stage, microbatches); GPipe: microbatches).
  int microbatches_in_flight = 0;
  int64_t largest_unit_gathered_bytes = 0;
  std::vector<UnitPlan> units;
  std::vector<Collective> collectives;
  int64_t payload_bytes_per_step = 0;
  int64_t wire_bytes_per_step = 0;
  // When PlanOptions has rates and links; a pipeline stage's needs its
  // neighbours' (pipeline_step_times).
  StepTime time;
};

// Throws std::invalid_argument for options the engines reject (a hybrid
// group that does not divide the world, a rank outside it, ...) or it does
// not model (activation checkpointing under DDP, on a pipeline stage or a
// model without checkpointed_activation_bytes).
Plan make_plan(const ModelSpec& model, const PlanOptions& options);

// The seconds one forward and backward of `model` (its units, the head and
// the loss) take at `rates`, as the step time counts them (Note [step
// time]); what a timed forward and backward of the model calibrates.
double forward_backward_seconds(const ModelSpec& model, const ComputeRates& rates);

// A pipeline's step time (Note [pipeline time], src/plan/pipeline_time.cpp):
// `ranks[r]` describes pipeline rank r (describe_gpt_stage or
// describe_llama_stage, or interleave_stages' merge of its chunks), each
// planned with `options` (its rates and links, the same data-parallel rank).
// The microbatches' forwards and backwards run in schedule_actions' order on
// every rank at once, each waiting for its neighbour's message; returns
// each rank's StepTime, whose `seconds` is the step's (the slowest rank's).
// Not predicted (seconds 0) without rates and links.
std::vector<StepTime> pipeline_step_times(const std::vector<ModelSpec>& ranks, const PlanOptions& options);

// "ddp" | "zero1" | "zero2" | "fsdp" | "hsdp" (the names `dtrain train`
// uses) into engine and strategy; throws std::invalid_argument naming the
// allowed values.
void set_strategy(PlanOptions& options, const std::string& name);
std::string strategy_name(const PlanOptions& options);

}  // namespace dtrain::plan
