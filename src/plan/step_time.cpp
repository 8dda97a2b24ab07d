// The seconds of a step's parts (src/plan/step_clock.h), for the replays
// that time a step as they count its bytes.
//
// Note [step time]
// A step's time is predicted in the same replay that plans its memory
// (simulate_step.cpp), so the two follow the same events and cannot drift
// apart; a pipeline is timed over all its ranks at once from the same
// costs (Note [pipeline time], pipeline_time.cpp). A rank has a compute stream and one
// link for the engine's collectives, which run one at a time in the order
// they are issued (the Communicator's thread). The replay advances the
// compute stream by each unit's forward and backward, issues the engine's
// all-gathers, reduce-scatters and DDP buckets on the link where the engine
// issues them (prefetch depth, the bound on reductions in flight, buckets
// closed in backward's order), and makes the compute stream wait where the
// engine waits for them (a unit entered before its gather is done, a
// reduction that must finish before the next, the end of backward). What
// the compute stream waited is the exposed communication.
// - Compute: a unit's forward is its matrix products' FLOPs
//   (UnitSpec::forward_flops) at the GEMM rate plus its saved activations
//   written once at the memory bandwidth (the elementwise kernels, norms and
//   softmax that make them, a proxy measured against the step, not per
//   kernel). The root runs first (the embeddings) and its tail last (the
//   head, ModelSpec::head_forward_flops, the logits and the loss), and the
//   tail's backward first and the root's own last. Backward is
//   twice the forward (two products per product; activations read and their
//   gradients written). Activation checkpointing adds a forward to each
//   recomputed unit's backward.
// - Compressed collectives (--fsdp-compress) make records from what they
//   send and read the received ones back, on the compute stream: the
//   records' bytes and the full buffer's, at the memory bandwidth.
// - On a CPU the transfers are the cores' work too: a share of each
//   collective's time (ComputeRates::communication_share, 1 where the
//   ranks' threads fill the cores) holds up compute even when overlapped.
// - The rates: the GEMM probe's (cached, as MFU's) and a copy's memory
//   bandwidth, both scaled by how fast this machine runs the model's own
//   kernels: one forward and backward of the model is timed and compared
//   with what these rates predict for it (forward_backward_seconds;
//   apps/dtrain/plan_time.cpp), so that small GEMMs, attention and the
//   elementwise kernels' real traffic are counted at the speed they run.
// - The optimizer streams this rank's elements: AdamW reads the parameter,
//   gradient and two states and writes three, with two temporaries written
//   and read (11 fp32 accesses); SGD with momentum 5, without 3.
// - Collectives: α-β on a link (Note [link cost]): the engine's on
//   PlanOptions::link, the model's own (tensor parallelism's all-reduces,
//   the ring's sends, a stage's messages) on PlanOptions::model_link. The
//   model's own run in line with compute (each layer waits for its
//   all-reduce), so all of their time is exposed.
// - A pipeline stage waits for its neighbours: the bubble
//   (pipeline_time.cpp).
// What it leaves out: kernel launch overheads, the gradient copies into
// reduction buffers and dtype casts, contention for memory bandwidth, and
// fixed per-step costs (the data loader, the step loop's bookkeeping,
// per-tensor optimizer calls), which weigh most in small models on a CPU.
// bench/plan_search.py measures how far that takes the prediction.
#include "plan/step_clock.h"
#include "plan/plan_internal.h"

#include <cstdint>

namespace dtrain::plan::detail {
namespace {

double optimizer_accesses(int optimizer_states) {
  return optimizer_states == 2 ? 11 : optimizer_states == 1 ? 5 : 3;
}

double link_seconds(const Collective& c, const Link& link) {
  return c.wire_bytes == 0 && latency_hops(c.op, c.group_size) == 0 ? 0 : collective_seconds(c, link);
}

}  // namespace

StepCosts::StepCosts(const ModelSpec& model, const Layout& layout, const FSDPOptions& fsdp) : layout_(layout) {
  const bool engine_link = layout.world_size == 1 || layout.link.bytes_per_second > 0;
  const bool model_link = model.collectives.empty() || layout.model_link.bytes_per_second > 0;
  predicted = layout.compute.known() && engine_link && model_link;
  const size_t units = model.units.size();
  forward.assign(units, 0);
  gather.assign(units, 0);
  reduce.assign(units, 0);
  gather_bytes.assign(units, 0);
  reduce_bytes.assign(units, 0);
  gather_casts.assign(units, 0);
  reduce_casts.assign(units, 0);
  if (!predicted) return;
  const double flops = layout.compute.flops_per_second, bandwidth = layout.compute.memory_bytes_per_second;
  int64_t elements = 0;
  for (size_t u = 0; u < units; ++u) {
    const UnitSpec& unit = model.units[u];
    forward[u] = unit.forward_flops / flops + static_cast<double>(unit.activation_bytes) / bandwidth;
    const FlatLayout flat = flat_layout(unit, layout);
    if (layout.ddp) {
      elements += flat.numel;
      continue;
    }
    for (int64_t count : flat.local_counts) elements += count;
    if (unit.parameters.empty() || layout.world_size == 1) continue;
    if (!(layout.group_size == 1 && layout.compute_bytes == layout.master_bytes)) {
      const Collective gathered = unit_all_gather(model, u, layout, fsdp);
      gather[u] = link_seconds(gathered, layout.link);
      gather_bytes[u] = gathered.wire_bytes;
      const int64_t full = flat.padded * layout.compute_bytes;
      if (gathered.payload_bytes != full)  // records: made from the shard, read back into the full buffer
        gather_casts[u] = static_cast<double>(gathered.payload_bytes + full) / bandwidth;
    }
    for (const auto& c : unit_reductions(model, u, layout, fsdp)) {
      reduce[u] += link_seconds(c, layout.link);
      reduce_bytes[u] += c.wire_bytes;
      if (c.op == "all_to_all")  // records of the full gradient, and the shard summed from them
        reduce_casts[u] = static_cast<double>(c.payload_bytes + flat.padded * layout.reduce_bytes) / bandwidth;
    }
  }
  tail = model.head_forward_flops / flops +
         static_cast<double>(model.root_tail_activation_bytes + model.output_bytes + model.loss_bytes) / bandwidth;
  optimizer = static_cast<double>(elements) * kFloatBytes * optimizer_accesses(layout.optimizer_states) / bandwidth;
  for (Collective c : model.collectives) {
    c.wire_bytes = wire_bytes(c.op, c.group_size, c.payload_bytes);
    model_collectives += link_seconds(c, layout.model_link);
  }
}

}  // namespace dtrain::plan::detail

namespace dtrain::plan {

double forward_backward_seconds(const ModelSpec& model, const ComputeRates& rates) {
  detail::Layout layout;
  layout.ddp = true;
  layout.compute = rates;
  const detail::StepCosts costs(model, layout, FSDPOptions{});
  double seconds = 3 * costs.tail;
  for (size_t u = 0; u < model.units.size(); ++u) seconds += costs.forward[u] + costs.backward(u);
  return seconds;
}

}  // namespace dtrain::plan

namespace dtrain::plan::detail {

double StepCosts::bucket(int64_t bytes) const {
  if (!predicted || layout_.world_size == 1) return 0;
  Collective c{"all_reduce", "gradient buckets", layout_.world_size, 1, bytes,
               wire_bytes("all_reduce", layout_.world_size, bytes)};
  return link_seconds(c, layout_.link);
}

}  // namespace dtrain::plan::detail
