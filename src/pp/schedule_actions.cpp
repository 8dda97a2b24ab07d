// What each pipeline rank runs in a step (include/dtrain/pipeline.h): the
// order of its microbatches' forwards and backwards under GPipe, 1F1B and
// interleaved 1F1B.
#include "dtrain/pipeline.h"

#include <algorithm>
#include <stdexcept>

namespace dtrain::pp {
namespace {

[[noreturn]] void refuse(const std::string& message) { throw std::invalid_argument("pipeline: " + message); }

// Note [interleaved schedule]
// Rank s of P holds chunks k = 0 .. v-1, the model's stages k P + s. The
// rank's i-th forward (of M v) is microbatch (i / (P v)) P + i % P through
// chunk (i mod P v) / P: groups of P microbatches go through chunk 0, then
// the same P through chunk 1, and so on, before the next P start. Its i-th
// backward takes the same microbatches with the chunks reversed (the
// last chunk first). Rank s first runs 2 (P - s - 1) + (v - 1) P forwards
// (the warmup: the first microbatch's backward needs every later rank's
// forwards of the last chunk, and the gradient's way back through the
// ranks after), then alternates one forward and one backward, then drains
// the backwards. This is Megatron-LM's order; every rank issues its
// activations to a neighbour in the order that neighbour consumes them, so
// a link's FIFO matches (Pipeline's links), and the order has no cycle of
// waits for any P >= 2, v >= 2 and M a multiple of P (a simulation of
// every rank's order against the data dependencies, tests/pp/test_pipeline.cpp,
// checks it and the bubble). The cost: up to 2 (P - s - 1) + (v - 1) P + 1
// chunk-microbatches of activations alive on rank s, against 1F1B's P - s
// stage-microbatches (each a chunk's 1/v of a stage's).
std::vector<Action> interleaved(int s, int P, int v, int M) {
  const int total = M * v;
  const auto forward_of = [&](int i) {
    return Action{true, (i % (P * v)) / P, (i / (P * v)) * P + i % P};
  };
  const auto backward_of = [&](int i) {
    Action a = forward_of(i);
    return Action{false, v - 1 - a.chunk, a.microbatch};
  };
  const int warmup = std::min(total, 2 * (P - s - 1) + (v - 1) * P);
  std::vector<Action> actions;
  for (int i = 0; i < warmup; ++i) actions.push_back(forward_of(i));
  for (int i = warmup; i < total; ++i) {
    actions.push_back(forward_of(i));
    actions.push_back(backward_of(i - warmup));
  }
  for (int i = total - warmup; i < total; ++i) actions.push_back(backward_of(i));
  return actions;
}

}  // namespace

Schedule schedule_from(const std::string& name) {
  if (name == "gpipe") return Schedule::GPipe;
  if (name == "1f1b") return Schedule::OneFOneB;
  if (name == "interleaved") return Schedule::Interleaved;
  throw std::invalid_argument("pipeline schedule '" + name + "' is not one of gpipe, 1f1b, interleaved");
}

std::string schedule_name(Schedule schedule) {
  switch (schedule) {
    case Schedule::GPipe: return "gpipe";
    case Schedule::OneFOneB: return "1f1b";
    case Schedule::Interleaved: return "interleaved";
  }
  return "?";
}

std::vector<Action> schedule_actions(Schedule schedule, int s, int P, int v, int M) {
  if (P < 1 || s < 0 || s >= P) refuse("stage " + std::to_string(s) + " of " + std::to_string(P) + " stages");
  if (M < 1) refuse(std::to_string(M) + " microbatches; need at least 1");
  if (schedule == Schedule::Interleaved) {
    if (P < 2) refuse("the interleaved schedule needs at least 2 stages, got " + std::to_string(P));
    if (v < 2)
      refuse("the interleaved schedule needs at least 2 chunks (virtual stages) per rank, got " + std::to_string(v));
    if (M % P != 0)
      refuse("the interleaved schedule runs microbatches in groups of the " + std::to_string(P) +
             " stages: " + std::to_string(M) + " microbatches is not a multiple of " + std::to_string(P));
    return interleaved(s, P, v, M);
  }
  if (v != 1)
    refuse(std::to_string(v) + " chunks (virtual stages) per rank need the interleaved schedule, not " +
           schedule_name(schedule));
  std::vector<Action> actions;
  if (schedule == Schedule::GPipe) {
    for (int m = 0; m < M; ++m) actions.push_back({true, 0, m});
    for (int m = 0; m < M; ++m) actions.push_back({false, 0, m});
    return actions;
  }
  // 1F1B: P - s - 1 forwards, then one forward and one backward, then the rest.
  const int warmup = std::min(P - s - 1, M);
  for (int m = 0; m < warmup; ++m) actions.push_back({true, 0, m});
  for (int m = warmup; m < M; ++m) {
    actions.push_back({true, 0, m});
    actions.push_back({false, 0, m - warmup});
  }
  for (int m = M - warmup; m < M; ++m) actions.push_back({false, 0, m});
  return actions;
}

}  // namespace dtrain::pp
