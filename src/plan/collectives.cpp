// What one rank hands to collectives in one step, and what it sends.
//
// Payload: the size of the buffer each collective works on (the gathered
// buffer for all-gather, the full gradient for reduce-scatter, the bucket
// for all-reduce), as DDPStepStats::bytes_sent counts for DDP. Wire bytes:
// what this rank sends with ring algorithms, (G-1)/G of the payload for
// all-gather and reduce-scatter and 2(G-1)/G for all-reduce; MPI and Gloo
// pick other algorithms for some sizes, which move as much or more.
// Compressed units (FSDPOptions::compression) hand over records instead:
// G records of the shard for an all-gather, and for gradients an all-to-all
// of G records (one per destination) in place of the reduce-scatter, which
// sends (G-1)/G of its buffer as a ring reduce-scatter does.
#include "plan/plan_internal.h"
#include "plan/replay.h"

#include "fsdp/schedule_rules.h"


#include <algorithm>
#include <string>

namespace dtrain::plan::detail {
namespace {

int64_t wire(const std::string& op, int group, int64_t payload) {
  if (op == "send") return payload;  // point to point: all of it to the one peer
  if (group <= 1) return 0;
  const int64_t share = payload / group * (group - 1);
  return op == "all_reduce" ? 2 * share : share;
}

Collective one_call(const std::string& op, const std::string& what, int group, int64_t payload) {
  return {op, what, group, 1, payload, wire(op, group, payload)};
}

// Adds a call (or calls) to the plan's kind of collective.
void add(Plan& plan, const Collective& call) {
  for (auto& c : plan.collectives) {
    if (c.op == call.op && c.what == call.what && c.group_size == call.group_size) {
      c.calls += call.calls;
      c.payload_bytes += call.payload_bytes;
      c.wire_bytes += call.wire_bytes;
      return;
    }
  }
  plan.collectives.push_back(call);
}

void add(Plan& plan, const std::string& op, const std::string& what, int group, int64_t payload) {
  add(plan, one_call(op, what, group, payload));
}

// Unit::Unit's choice of formats for unit u.
const CollectiveCompression& compression_of(const ModelSpec& model, size_t u, const FSDPOptions& fsdp) {
  const auto found = fsdp.compression_by_unit.find(model.units[u].name);
  return found != fsdp.compression_by_unit.end() ? found->second : fsdp.compression;
}

// DDP's buckets (src/ddp/bucket_assignment.cpp with the default caps):
// parameters from last to first, a bucket closed when the next parameter
// would take it over its cap (replay.h, DDPBucketFill).
void add_ddp_buckets(const ModelSpec& model, const Layout& layout, Plan& plan) {
  for (const int64_t bytes : ddp_bucket_bytes(model)) add(plan, "all_reduce", "gradient buckets", layout.world_size, bytes);
}

// A pipeline stage's messages to its neighbours (each microbatch's
// activation forward, its gradient back), the tied wte's gradient summed over
// the first and the last stage (pp::sum_tied_gradients: the shard, under
// FSDP), and the loss from the last stage.
void add_pipeline(const ModelSpec& model, const Layout& layout, Plan& plan) {
  const auto& stage = model.pipeline;
  // Each chunk's (interleaved), or the stage's.
  std::vector<ModelSpec::PipelineStage> chunks;
  for (const auto& chunk : model.chunks) chunks.push_back(chunk.pipeline);
  if (chunks.empty()) chunks.push_back(stage);
  for (const auto& chunk : chunks) {
    for (int m = 0; m < chunk.microbatches; ++m) {
      if (!chunk.last()) add(plan, "send", "activations, pipeline", 2, chunk.message_bytes);
      if (!chunk.first()) add(plan, "send", "activation gradients, pipeline", 2, chunk.message_bytes);
    }
  }
  if (stage.tied_unit) {
    const auto flat = flat_layout(model.units[stage.tied_unit_at], layout);
    add(plan, "all_reduce", "tied embedding gradient, end stages", 2, (layout.ddp ? flat.numel : flat.shard) * 4);
  }
  add(plan, "all_reduce", "loss, pipeline", stage.stages, 8);
}

}  // namespace

int64_t float8_record_bytes(const ModelSpec& model, size_t u, const Layout& layout, const FSDPOptions& fsdp) {
  const UnitSpec& unit = model.units[u];
  if (layout.ddp || layout.float8_gather.scaling == Float8Scaling::Off || unit.parameters.empty()) return 0;
  if (layout.group_size == 1) return 0;  // Unit::float8_candidates: nothing crosses a wire
  // Unit::float8_candidates: only where the plain gather would run.
  const auto& compression = compression_of(model, u, fsdp);
  auto format = fsdp_rules::effective_format(fsdp_rules::wire_format(compression.params), layout.group_size);
  if (format == fsdp_rules::WireFormat::BF16 && layout.compute_bytes == 2) format = fsdp_rules::WireFormat::Plain;
  if (format != fsdp_rules::WireFormat::Plain) return 0;
  const auto flat = flat_layout(unit, layout);
  // Float8Gather: each rank's part of the other parameters, the largest sent by all.
  std::vector<int64_t> others(static_cast<size_t>(layout.group_size), 0);
  bool any = false;
  int64_t offset = 0;
  for (const auto& p : unit.parameters) {
    const bool fp8 = p.linear_in > 0 && float8_eligible(p.linear_in, p.linear_out, layout.float8_gather);
    any = any || fp8;
    for (int r = 0; r < layout.group_size && !fp8; ++r) {
      const int64_t begin = std::max(offset, r * flat.shard), end = std::min(offset + p.numel, (r + 1) * flat.shard);
      if (begin < end) others[static_cast<size_t>(r)] += end - begin;
    }
    offset += p.numel;
  }
  if (!any) return 0;
  return flat.shard + *std::max_element(others.begin(), others.end()) * layout.compute_bytes;
}

Collective unit_all_gather(const ModelSpec& model, size_t u, const Layout& layout, const FSDPOptions& fsdp) {
  const int G = layout.group_size;
  if (const int64_t record = float8_record_bytes(model, u, layout, fsdp); record > 0)
    return one_call("all_gather", "parameters, fp8", G, G * record);
  const auto flat = flat_layout(model.units[u], layout);
  const auto& compression = compression_of(model, u, fsdp);
  auto format = fsdp_rules::effective_format(fsdp_rules::wire_format(compression.params), G);
  if (format == fsdp_rules::WireFormat::BF16 && layout.compute_bytes == 2) format = fsdp_rules::WireFormat::Plain;
  return one_call("all_gather", "parameters", G,
                  G * fsdp_rules::record_bytes(format, flat.shard, compression.block_size, layout.compute_bytes));
}

std::vector<Collective> unit_reductions(const ModelSpec& model, size_t u, const Layout& layout,
                                        const FSDPOptions& fsdp) {
  const int G = layout.group_size;
  const auto flat = flat_layout(model.units[u], layout);
  const auto& compression = compression_of(model, u, fsdp);
  const auto format = fsdp_rules::effective_format(fsdp_rules::wire_format(compression.grads), G);
  std::vector<Collective> calls;
  if (layout.strategy == Sharding::OptimizerOnly)
    calls.push_back(one_call("all_reduce", "gradients", G, flat.padded * layout.reduce_bytes));
  else if (format != fsdp_rules::WireFormat::Plain)
    calls.push_back(one_call("all_to_all", "gradients, compressed", G,
                             G * fsdp_rules::record_bytes(format, flat.shard, compression.block_size,
                                                          layout.reduce_bytes)));
  else
    calls.push_back(one_call("reduce_scatter", "gradients", G, flat.padded * layout.reduce_bytes));
  if (layout.replicas > 1)
    calls.push_back(one_call("all_reduce", "gradient shards across replicas", layout.replicas,
                             flat.shard * layout.reduce_bytes));
  return calls;
}

int64_t wire_bytes(const std::string& op, int group_size, int64_t payload_bytes) {
  return wire(op, group_size, payload_bytes);
}

void count_collectives(const ModelSpec& model, const Layout& layout, const FSDPOptions& fsdp, Plan& plan) {
  if (layout.ddp) {
    add_ddp_buckets(model, layout, plan);
    // Interleaved chunks: DDP finds the chunks its last backward does not
    // reach (find_unused_parameters), one int32 per parameter summed over
    // the ranks (Reducer::parameters_used_anywhere).
    if (!model.chunks.empty() && layout.world_size > 1) {
      int64_t tensors = 0;
      for (const auto& unit : model.units) tensors += static_cast<int64_t>(unit.parameters.size());
      add(plan, "all_reduce", "used parameters (find_unused)", layout.world_size, tensors * 4);
    }
    if (model.buffer_bytes > 0) add(plan, "broadcast", "buffers from rank 0", layout.world_size, model.buffer_bytes);
  } else {
    const bool gathers = !(layout.group_size == 1 && layout.compute_bytes == layout.master_bytes);
    // A pipeline stage gathers each unit once per step (Note [pipeline steps]).
    const bool regather = model.pipeline.stages == 1 &&
                          (layout.strategy == Sharding::Full || layout.strategy == Sharding::Hybrid);
    for (size_t u = 0; u < model.units.size(); ++u) {
      if (model.units[u].parameters.empty()) continue;
      Collective gather = unit_all_gather(model, u, layout, fsdp);
      if (gathers && model.pipeline.stages > 1 && layout.gather_per_microbatch && u != 0) {
        // FSDPState::gather_for_step(true): gathered for each microbatch's
        // forward, and again for its backward where the forward resharded.
        const bool reshards = fsdp_rules::reshard_after_forward(layout.strategy, false);
        for (int m = 0; m < model.pipeline.microbatches; ++m) {
          gather.what = "parameters, microbatch forward";
          add(plan, gather);
          gather.what = "parameters, microbatch backward";
          if (reshards) add(plan, gather);
        }
      } else if (gathers) {
        gather.what = model.pipeline.stages > 1 ? "parameters, step" : "parameters, forward";
        add(plan, gather);
        gather.what = "parameters, backward";
        if (regather && u != 0) add(plan, gather);
      }
      for (const auto& c : unit_reductions(model, u, layout, fsdp)) add(plan, c);
    }
  }
  if (model.pipeline.stages > 1) add_pipeline(model, layout, plan);
  // The model's own (tensor parallelism's), over its group.
  for (Collective c : model.collectives) {
    c.wire_bytes = wire(c.op, c.group_size, c.payload_bytes);
    plan.collectives.push_back(c);
  }
  for (const auto& c : plan.collectives) {
    plan.payload_bytes_per_step += c.payload_bytes;
    plan.wire_bytes_per_step += c.wire_bytes;
  }
}

}  // namespace dtrain::plan::detail
