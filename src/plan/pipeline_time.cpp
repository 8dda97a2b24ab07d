// A pipeline's step time, every rank at once (include/dtrain/plan.h,
// pipeline_step_times).
//
// Note [pipeline time]
// One rank's replay cannot see its bubble: that is its neighbours' time. So
// the pipeline is timed over all its ranks together, with each rank's parts
// costed as Note [step time] costs them (StepCosts over each chunk's
// description at one microbatch):
// - before the microbatches, a sharded strategy gathers every unit of the
//   rank (FSDPState::gather_for_step issues them all, and the first
//   microbatch waits), or, with gather_per_microbatch, each action waits
//   for its chunk's units' gathers;
// - each action (pp::schedule_actions' order on each rank) starts when its
//   rank is free and its input has arrived: a forward after the previous
//   virtual stage's forward of the microbatch and the message's α + n/β on
//   the model's link; a backward after the next virtual stage's backward
//   and its message. A forward takes the chunk's units' forwards (and the
//   tail on the last stage), a backward twice that, each with its share of
//   the chunk's own collectives (tensor parallelism's, the ring's), in line;
// - after its last action a rank reduces its gradients: DDP's buckets
//   all-reduce under the last backward (exposed: what they take beyond it),
//   a sharded strategy's reductions run after every microbatch, exposed;
//   then the tied embedding's all-reduce and the loss's, and the optimizer.
// A rank's step ends there; the step is the slowest rank's, and a rank's
// time between its work and the step's end is its bubble.
#include "plan/plan_internal.h"
#include "plan/replay.h"
#include "plan/step_clock.h"

#include <dtrain/pipeline.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::plan {
namespace {

struct ChunkTimes {
  double forward = 0, backward = 0;  // compute, one microbatch
  double in_line = 0;                // its own collectives per action
  double gather = 0;                 // its units' all-gathers (and compressed casts), once
  double message = 0;                // what it sends on (or back), one microbatch
  int64_t message_bytes = 0;
};

constexpr double kNever = std::numeric_limits<double>::infinity();

// --explain: a span of rank `t`'s predicted step.
void record(StepTime& t, bool on, std::string name, const char* category, bool link, double start, double seconds,
            int64_t bytes = 0) {
  if (on && seconds > 0) t.spans.push_back({std::move(name), category, link, start, seconds, bytes});
}

}  // namespace

std::vector<StepTime> pipeline_step_times(const std::vector<ModelSpec>& ranks, const PlanOptions& options) {
  const int P = static_cast<int>(ranks.size());
  if (P < 2) throw std::invalid_argument("plan: a pipeline has at least 2 ranks");
  const detail::Layout layout = detail::resolve_layout(options);
  const int M = ranks[0].pipeline.microbatches;
  const int V = ranks[0].chunks.empty() ? 1 : static_cast<int>(ranks[0].chunks.size());
  std::vector<StepTime> times(static_cast<size_t>(P));
  std::vector<std::vector<ChunkTimes>> chunks(static_cast<size_t>(P));
  std::vector<double> before(static_cast<size_t>(P)), after(static_cast<size_t>(P)), optimizer(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    const ModelSpec& model = ranks[static_cast<size_t>(r)];
    const detail::StepCosts whole(model, layout, options.fsdp);
    if (!whole.predicted) return std::vector<StepTime>(static_cast<size_t>(P));
    std::vector<const ModelSpec*> parts{&model};
    if (!model.chunks.empty()) {
      parts.clear();
      for (const auto& chunk : model.chunks) parts.push_back(&chunk);
    }
    const bool gathers = !layout.ddp;
    for (const ModelSpec* part : parts) {
      const detail::StepCosts costs(*part, layout, options.fsdp);
      ChunkTimes c;
      for (size_t u = 0; u < part->units.size(); ++u) {
        c.forward += costs.forward[u];
        c.gather += costs.gather[u] + costs.gather_casts[u];
      }
      c.forward += costs.tail;
      c.backward = 2 * c.forward;
      c.in_line = costs.model_collectives / (2.0 * M);
      const Collective send{"send", "", 2, 1, part->pipeline.message_bytes, part->pipeline.message_bytes};
      c.message = part->pipeline.message_bytes > 0 ? collective_seconds(send, layout.model_link) : 0;
      c.message_bytes = part->pipeline.message_bytes;
      chunks[static_cast<size_t>(r)].push_back(c);
    }
    auto& t = times[static_cast<size_t>(r)];
    double gather = 0, reduce = 0;
    for (size_t u = 0; u < model.units.size(); ++u) {
      gather += whole.gather[u];
      reduce += whole.reduce[u] + whole.reduce_casts[u];
    }
    if (gathers && !layout.gather_per_microbatch) before[static_cast<size_t>(r)] = gather;
    if (layout.ddp) {
      double buckets = 0;  // the whole replica's gradients, in DDP's buckets
      for (const int64_t bytes : detail::ddp_bucket_bytes(model)) buckets += whole.bucket(bytes);
      const double last_backward = chunks[static_cast<size_t>(r)][0].backward;
      // Overlapped with the last backward, but for the share of the cores they take.
      const double share = layout.compute.communication_share;
      after[static_cast<size_t>(r)] = share * buckets + (1 - share) * std::max(0.0, buckets - last_backward);
      t.communication_seconds += buckets;
    } else {
      after[static_cast<size_t>(r)] = reduce;
      t.communication_seconds += gather + reduce;
    }
    // The tied embedding's gradient and the loss, over the pipeline.
    if (model.pipeline.tied_unit) {
      const auto flat = detail::flat_layout(model.units[model.pipeline.tied_unit_at], layout);
      const int64_t bytes = (layout.ddp ? flat.numel : flat.shard) * 4;
      const Collective tied{"all_reduce", "", 2, 1, bytes, detail::wire_bytes("all_reduce", 2, bytes)};
      after[static_cast<size_t>(r)] += collective_seconds(tied, layout.model_link);
      t.communication_seconds += collective_seconds(tied, layout.model_link);
    }
    const Collective loss{"all_reduce", "", P, 1, 8, detail::wire_bytes("all_reduce", P, 8)};
    after[static_cast<size_t>(r)] += collective_seconds(loss, layout.model_link);
    t.communication_seconds += collective_seconds(loss, layout.model_link);
    optimizer[static_cast<size_t>(r)] = whole.optimizer;
  }

  // The microbatches: every rank's actions in order, each when its input is there.
  std::vector<std::vector<pp::Action>> actions(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r)
    actions[static_cast<size_t>(r)] = pp::schedule_actions(options.schedule, r, P, V, M);
  const int stages = P * V;
  // When each virtual stage's forward and backward of each microbatch ended.
  std::vector<std::vector<double>> forward_end(static_cast<size_t>(stages), std::vector<double>(M, kNever));
  std::vector<std::vector<double>> backward_end = forward_end;
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  std::vector<double> free_at(before.begin(), before.end());
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int r = 0; r < P; ++r) {
      auto& i = next[static_cast<size_t>(r)];
      while (i < actions[static_cast<size_t>(r)].size()) {
        const pp::Action& a = actions[static_cast<size_t>(r)][i];
        const int v = a.chunk * P + r;
        const ChunkTimes& c = chunks[static_cast<size_t>(r)][static_cast<size_t>(a.chunk)];
        double ready = 0;
        if (a.forward && v > 0) {
          const ChunkTimes& sender = chunks[static_cast<size_t>((v - 1) % P)][static_cast<size_t>((v - 1) / P)];
          ready = forward_end[static_cast<size_t>(v - 1)][static_cast<size_t>(a.microbatch)] + sender.message;
        } else if (!a.forward && v < stages - 1) {
          const ChunkTimes& sender = chunks[static_cast<size_t>((v + 1) % P)][static_cast<size_t>((v + 1) / P)];
          ready = backward_end[static_cast<size_t>(v + 1)][static_cast<size_t>(a.microbatch)] + sender.message;
        }
        if (ready == kNever) break;  // its input is not computed yet
        const bool sends = a.forward ? v + 1 < stages : v > 0;
        const double work = (a.forward ? c.forward : c.backward) + c.in_line +
                            (layout.gather_per_microbatch && !layout.ddp ? c.gather : 0) +
                            (sends ? layout.compute.communication_share * c.message : 0);
        const double start = std::max(free_at[static_cast<size_t>(r)], ready);
        const double end = start + work;
        (a.forward ? forward_end : backward_end)[static_cast<size_t>(v)][static_cast<size_t>(a.microbatch)] = end;
        free_at[static_cast<size_t>(r)] = end;
        auto& t = times[static_cast<size_t>(r)];
        const double compute = a.forward ? c.forward : c.backward;
        const std::string what = std::string(a.forward ? "forward" : "backward") + " of microbatch " +
                                 std::to_string(a.microbatch) + (V > 1 ? " (chunk " + std::to_string(a.chunk) + ")" : "");
        record(t, layout.explain, what, "compute", false, start, compute);
        record(t, layout.explain, "collectives and sends in line", "wait", false, start + compute, work - compute);
        record(t, layout.explain, "the model's own collectives", "comm", true, start + compute, c.in_line);
        if (sends)
          record(t, layout.explain, a.forward ? "send activations" : "send gradients", "comm", true, end, c.message,
                 c.message_bytes);
        t.compute_seconds += compute;
        t.communication_seconds += c.in_line + (sends ? c.message : 0);
        t.exposed_communication_seconds += c.in_line + (sends ? layout.compute.communication_share * c.message : 0);
        if (layout.gather_per_microbatch && !layout.ddp) {
          t.communication_seconds += c.gather;
          t.exposed_communication_seconds += c.gather;
        }
        ++i;
        progressed = true;
      }
    }
  }
  double step = 0;
  for (int r = 0; r < P; ++r) {
    if (next[static_cast<size_t>(r)] != actions[static_cast<size_t>(r)].size())
      throw std::logic_error("plan: the pipeline's schedules wait on each other (a bug in dtrain plan)");
    step = std::max(step, free_at[static_cast<size_t>(r)] + after[static_cast<size_t>(r)] +
                              optimizer[static_cast<size_t>(r)]);
  }
  for (int r = 0; r < P; ++r) {
    auto& t = times[static_cast<size_t>(r)];
    const double done = free_at[static_cast<size_t>(r)];
    record(t, layout.explain, "all-gather the rank's units", "comm", true, 0, before[static_cast<size_t>(r)]);
    record(t, layout.explain, "wait", "wait", false, 0, before[static_cast<size_t>(r)]);
    record(t, layout.explain, "reduce gradients, tied embedding, loss", "comm", true, done, after[static_cast<size_t>(r)]);
    record(t, layout.explain, "wait", "wait", false, done, after[static_cast<size_t>(r)]);
    record(t, layout.explain, "optimizer step", "compute", false, done + after[static_cast<size_t>(r)],
           optimizer[static_cast<size_t>(r)]);
    record(t, layout.explain, "step", "step", false, 0, step);
    t.compute_seconds += optimizer[static_cast<size_t>(r)];
    t.exposed_communication_seconds += before[static_cast<size_t>(r)] + after[static_cast<size_t>(r)];
    t.seconds = step;
    t.bubble_seconds = std::max(0.0, step - t.compute_seconds - t.exposed_communication_seconds);
  }
  return times;
}

}  // namespace dtrain::plan
