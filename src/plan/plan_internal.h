// The parts of make_plan (include/dtrain/plan.h), one file each.
#pragma once

#include "dtrain/plan.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::plan::detail {

// Bytes of the float32 and int64 tensors a model description counts.
inline constexpr int64_t kFloatBytes = 4;
inline constexpr int64_t kLongBytes = 8;

// What the planner needs to know of the run, resolved from PlanOptions.
struct Layout {
  bool ddp = false;
  Sharding strategy = Sharding::Full;
  int world_size = 1;
  int rank = 0;
  int group_size = 1;       // ranks the parameters are sharded over
  int group_rank = 0;       // this rank's index in its sharding group
  int replicas = 1;         // copies of each shard (Hybrid: world / group; None: world)
  int64_t master_bytes = 4;   // the parameters' own dtype (fp32)
  int64_t compute_bytes = 4;  // mixed_precision.param_dtype
  int64_t reduce_bytes = 4;   // mixed_precision.reduce_dtype
  int optimizer_states = 2;   // fp32 tensors per parameter element
  bool gather_per_microbatch = false;  // a pipeline stage's units gathered per microbatch (PlanOptions)
  ComputeRates compute;  // PlanOptions': a step's time is predicted when these
  Link link, model_link;  // and the links are known (Note [step time])
  bool explain = false;   // record the step's spans (StepTime::spans)
  // PlanOptions::float8 where fsdp.float8_all_gather asks for it and the
  // scaling is tensorwise; else off.
  Float8Settings float8_gather{};
};

// PlanOptions checked and resolved (std::invalid_argument for what the
// engines refuse).
Layout resolve_layout(const PlanOptions& options);

// A unit's flat buffer as FlatParameter lays it out for `layout`
// (src/fsdp/flat_parameter.cpp).
struct FlatLayout {
  int64_t numel = 0, padded = 0, shard = 0;
  std::vector<int64_t> local_counts;  // per parameter: its elements inside this rank's shard
};
FlatLayout flat_layout(const UnitSpec& unit, const Layout& layout);

// Bytes of this rank's record when unit u gathers its fp8 weights as fp8
// (src/fsdp/float8_gather.h: a byte per shard element, then the other
// parameters' part in the compute dtype, padded to the ranks' largest);
// 0 when it gathers as without (Note [float8 all-gather]).
int64_t float8_record_bytes(const ModelSpec& model, size_t u, const Layout& layout, const FSDPOptions& fsdp);

// The bytes of this rank's checkpoint file, as the staging buffer of
// --checkpoint-async holds them (src/plan/checkpoint_staging.cpp).
int64_t checkpoint_staging_bytes(const ModelSpec& model, const Layout& layout, Optimizer optimizer);

// Replays one steady-state step; fills peak, peak_moment, between_steps,
// max_units_gathered and largest_unit_gathered_bytes.
void simulate_step(const ModelSpec& model, const Layout& layout, const FSDPOptions& fsdp, Plan& plan);

// The same for a pipeline stage (model.pipeline.stages > 1) under `schedule`;
// also fills microbatches_in_flight. Note [pipeline memory plan].
void simulate_pipeline_step(const ModelSpec& model, const Layout& layout, const FSDPOptions& fsdp,
                            pp::Schedule schedule, Plan& plan);

// Replays the start of a run; fills construction and construction_moment.
void simulate_construction(const ModelSpec& model, const Layout& layout, bool init_from, Plan& plan);

// Fills collectives, payload_bytes_per_step and wire_bytes_per_step (with
// fsdp's compression: its records' bytes, fsdp_rules::record_bytes).
void count_collectives(const ModelSpec& model, const Layout& layout, const FSDPOptions& fsdp, Plan& plan);

// A transformer's FLOPs (UnitSpec::forward_flops, ModelSpec::
// head_forward_flops) at `tokens` tokens per rank of sequences of `seq_len`
// (the whole sequence: under context parallelism a rank's queries still
// meet every earlier key): each block's parameters twice per token, its
// causal attention 2 x seq_len x attention_width per token (half of the
// scores' and the weighted sum's 4 T W: the mask skips the rest), and the
// head's `head_numel` twice per token.
void set_transformer_flops(ModelSpec& model, int64_t tokens, int64_t seq_len, int64_t attention_width,
                           int64_t head_numel);

// One all-gather of unit u's parameters (what count_collectives counts per
// gather, compression included), and the collectives that reduce its
// gradients once (reduce-scatter, all-reduce or compressed all-to-all, then
// across replicas), each one call with its wire bytes.
Collective unit_all_gather(const ModelSpec& model, size_t u, const Layout& layout, const FSDPOptions& fsdp);
std::vector<Collective> unit_reductions(const ModelSpec& model, size_t u, const Layout& layout,
                                        const FSDPOptions& fsdp);
// What this rank sends of a `payload_bytes` collective with ring algorithms.
int64_t wire_bytes(const std::string& op, int group_size, int64_t payload_bytes);

// A pipeline stage's arguments: stage < stages (at least 2), and a batch
// part that splits into the microbatches; std::invalid_argument otherwise.
void check_stage(int64_t batch_per_rank, int microbatches, int stage, int stages);
// A tensor-parallel stage's collectives per step (`model.pipeline` set):
// per microbatch of `tokens` tokens an all-reduce of `token_bytes` per token
// after each row-parallel layer and before each column-parallel one (4 per
// block), the embedding's on the first stage and the head input's on the
// last, and the loss's three on the last. Under sequence parallelism each
// all-reduce is an all-gather and a reduce-scatter, and the stage's
// boundaries add an all-gather each (Note [sequence parallel stages] in
// src/tp/tp_gpt_stage.cpp: a stage before the last gathers its output, and
// a stage after the first gathers its input's gradient). Nothing for tp = 1.
void add_stage_tp_collectives(ModelSpec& model, int tp, int64_t blocks, int64_t tokens, int64_t token_bytes,
                              bool sequence_parallel);
// The tokens of a sequence of `seq_len` one of `cp` ranks holds; throws
// std::invalid_argument unless 2 cp divides seq_len (head and tail chunks).
int64_t context_parallel_tokens(int64_t seq_len, int cp);

// Ring attention over `cp` ranks on a model described at `local_tokens` per
// rank (batch x T / cp), attention `width` (its heads x head_dim on this
// rank): what every block (units[1...]) keeps and holds besides, and the
// ring's sends (Note [ring attention plan], describe_context_parallel.cpp).
// `mlp_bytes_per_token`: the MLP activations per token that a block's
// backward frees before it reaches attention.
void add_ring_attention(ModelSpec& model, int cp, int64_t local_tokens, int64_t width, int64_t compute_bytes,
                        int64_t mlp_bytes_per_token);
// The ring's sends alone, for `block_passes` passes of a block's attention
// (forward and backward) over `local_tokens`: a pipeline stage's blocks
// times its microbatches.
void add_ring_sends(ModelSpec& model, int cp, int64_t block_passes, int64_t local_tokens, int64_t width,
                    int64_t compute_bytes);

}  // namespace dtrain::plan::detail
