// Pipeline parallelism: a model's consecutive stages on the ranks of a
// pipeline group (DeviceMesh's "pp" communicator; rank s holds stage s),
// activations sent forward and their gradients back, point to point, one
// microbatch at a time.
//
// One training step splits the batch into M microbatches. GPipe runs every
// microbatch's forward, then every backward (each stage keeps all M
// microbatches' activations); 1F1B runs stage s's first P - s - 1 forwards,
// then alternates one forward and one backward, so that at most P - s
// microbatches' activations are alive on stage s (P stages). Both give the
// full batch's gradients: each microbatch's loss (a mean over its samples)
// is divided by M before its backward, and the gradients accumulate.
//
// Interleaved 1F1B (Megatron-LM's virtual pipeline): each rank holds v
// chunks of the model, not one stage: with P ranks the model is P x v
// consecutive stages and rank s holds stages s, s + P, ..., s + (v-1) P, so
// a microbatch passes every rank v times (rank P-1 sends to rank 0 between
// rounds). A step runs M x v chunk forwards and backwards per rank, in
// groups of P microbatches per chunk; the fill and drain then last a chunk's
// time, not a stage's, and the idle share of a step falls from
// (P-1)/(M+P-1) to about (P-1)/(v M+P-1), for more activations alive at once
// (Note [interleaved schedule], src/pp/schedule_actions.cpp) and v times the
// messages. M must be a multiple of P.
//
// Each link between neighbouring ranks (s to s+1, and P-1 to 0 when
// interleaved) has two communicators of its own: one for the activations
// forward and one for the gradients back. Each then carries one direction of
// one link, a FIFO that both ends issue in the same order, so a send that
// waits for its receiver (on c10d always; on MPI above the eager limit)
// never waits behind a message the receiver wants later.
//
//   dtrain::pp::Pipeline pipeline(mesh.comm("pp"), dtrain::pp::Schedule::OneFOneB, /*microbatches=*/4);
//   const double loss = pipeline.step(
//       [&](const torch::Tensor& x) { return stage->forward(x); },
//       [&](const torch::Tensor& logits, const torch::Tensor& t) { return cross_entropy(logits..., t...); },
//       tokens, targets, {tokens.size(0) / 4, T, C});
//   dtrain::pp::sum_tied_gradients(stage->tied_weight(), pipeline);  // GPT's tied head
//   optimizer.step();
#pragma once

#include <dtrain/comm.h>

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dtrain::pp {

// Blocks [first, last) of one stage.
struct StageBlocks {
  int64_t first = 0, last = 0;
};
// Blocks of each of `stages` stages: `split` (blocks per stage, summing to
// `blocks`), or as even as possible (the first blocks % stages stages one
// more). Throws std::invalid_argument naming the numbers when a stage would
// be empty or the split does not add up.
std::vector<StageBlocks> divide_blocks(int64_t blocks, int stages, const std::vector<int64_t>& split = {});

enum class Schedule { GPipe, OneFOneB, Interleaved };
// "gpipe" | "1f1b" | "interleaved"; throws std::invalid_argument naming them.
Schedule schedule_from(const std::string& name);
std::string schedule_name(Schedule schedule);

// One entry of a stage's schedule: a microbatch's forward or backward
// through one of the rank's chunks (always chunk 0 but when interleaved).
struct Action {
  bool forward = true;
  int chunk = 0;
  int microbatch = 0;
};
// What rank `stage` of `stages` runs in one step, in order, holding `chunks`
// chunks (1 but for Interleaved). Throws std::invalid_argument naming the
// numbers when the schedule cannot run them: Interleaved needs stages >= 2,
// chunks >= 2 and microbatches a multiple of stages; the others one chunk.
std::vector<Action> schedule_actions(Schedule schedule, int stage, int stages, int chunks, int microbatches);

// The stage's forward on one microbatch: the first stage gets its slice of
// the inputs, the others the activation received from the stage before.
using StageForward = std::function<torch::Tensor(const torch::Tensor&)>;
// Interleaved: the forward of the rank's chunk `chunk` (0 .. v-1, stage
// stage() + chunk x stages() of the model's stages() x v).
using ChunkForward = std::function<torch::Tensor(int chunk, const torch::Tensor&)>;
// The last stage's loss of its output on a microbatch's targets: a scalar,
// the mean over the microbatch.
using StageLoss = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;
// Runs one microbatch's `backward`; `sync` is true for the step's last
// backward only. A data-parallel engine over the stage (DDP or FSDP over the
// mesh's dp dimension) reduces its gradients then and only accumulates
// before (run the others under its no_sync()):
//   [&](bool sync, const std::function<void()>& backward) {
//     if (sync) return backward();
//     auto guard = ddp.no_sync();
//     backward();
//   }
using BackwardRunner = std::function<void(bool sync, const std::function<void()>& backward)>;

// Note [stage dtype]
// What crosses a stage boundary, the activation forward and its gradient
// backward, travels in the `dtype` the caller names: a stage's output is
// cast to it before the send (a no-op when the stage computes in it), and a
// received gradient is cast back to the output's dtype before backward. With
// bf16 compute (--mixed-precision bf16) the trainer names bf16, so a boundary
// costs half of fp32's bytes and the next stage receives what it would have
// computed in one process; the final logits of infer() come in `dtype` too.
// (The trainer scores the last stage's logits in fp32; src/train/trainer.cpp.)
class Pipeline {
 public:
  // Collective over `group` (splits it once per link and direction).
  // `chunks`: the model chunks each rank holds (v, Interleaved only). Throws
  // std::invalid_argument for microbatches < 1 or what schedule_actions refuses.
  Pipeline(CommPtr group, Schedule schedule, int microbatches, int chunks = 1);

  // One step's forwards and backwards (collective over the group). `inputs`
  // and `targets`: the whole batch on every stage (only the first stage reads
  // inputs, only the last targets); the batch must split into the
  // microbatches evenly. `activation_shape`: what one stage sends the next
  // per microbatch ([B / M, T, C] for the GPT), in `dtype`, the same for
  // every stage boundary (Note [stage dtype]). Returns the step's loss (the mean of the
  // microbatches' losses) on every stage. Gradients accumulate into the
  // stage's parameters as loss.backward() would for the whole batch.
  // Interleaved: `forward` runs one of the rank's chunks; the first rank's
  // chunk 0 reads inputs, the last rank's last chunk gives the loss. With
  // one chunk, forward is called with chunk 0.
  double step(const ChunkForward& forward, const StageLoss& loss, const torch::Tensor& inputs,
              const torch::Tensor& targets, const std::vector<int64_t>& activation_shape,
              torch::ScalarType dtype = torch::kFloat32, const BackwardRunner& run_backward = nullptr);
  // One chunk per rank (not interleaved).
  double step(const StageForward& forward, const StageLoss& loss, const torch::Tensor& inputs,
              const torch::Tensor& targets, const std::vector<int64_t>& activation_shape,
              torch::ScalarType dtype = torch::kFloat32, const BackwardRunner& run_backward = nullptr);

  // Evaluation: forwards only, without gradients, microbatch after
  // microbatch through the stages. The batch splits into M microbatches as
  // evenly as it goes (activation_shape's first dimension is each
  // microbatch's size), empty ones too when B < M, so that every rank of a
  // data-parallel group runs M forwards (the sharded engines gather in each). `loss` gives the last stage's value for a
  // microbatch (e.g. its summed per-sample losses); returns the sum over the
  // microbatches on every stage. Collective over the group.
  double evaluate(const ChunkForward& forward, const StageLoss& loss, const torch::Tensor& inputs,
                  const torch::Tensor& targets, std::vector<int64_t> activation_shape,
                  torch::ScalarType dtype = torch::kFloat32);
  double evaluate(const StageForward& forward, const StageLoss& loss, const torch::Tensor& inputs,
                  const torch::Tensor& targets, std::vector<int64_t> activation_shape,
                  torch::ScalarType dtype = torch::kFloat32);

  // Inference on the whole batch as one microbatch: the last stage's output
  // (of `output_shape`, in `dtype`), on every stage. For generating text
  // (a forward per new token); without gradients. Collective over the group.
  torch::Tensor infer(const ChunkForward& forward, const torch::Tensor& inputs,
                      const std::vector<int64_t>& activation_shape, const std::vector<int64_t>& output_shape,
                      torch::ScalarType dtype = torch::kFloat32);
  torch::Tensor infer(const StageForward& forward, const torch::Tensor& inputs,
                      const std::vector<int64_t>& activation_shape, const std::vector<int64_t>& output_shape,
                      torch::ScalarType dtype = torch::kFloat32);

  // The most microbatches whose activations this stage held at once in the
  // last step, counted per chunk (1F1B: at most stages - stage; GPipe:
  // microbatches; Interleaved: up to 2 (stages - stage - 1) + (v-1) stages + 1
  // chunk-microbatches, each a chunk's 1/v of a stage's activations).
  int max_in_flight() const { return max_in_flight_; }
  int stage() const { return group_->rank(); }
  int stages() const { return group_->size(); }
  int microbatches() const { return microbatches_; }
  int chunks() const { return chunks_; }
  Schedule schedule() const { return schedule_; }
  const CommPtr& group() const { return group_; }

 private:
  friend void sum_tied_gradients(const torch::Tensor& weight, const Pipeline& pipeline);
  bool first_chunk(int chunk) const { return stage() == 0 && chunk == 0; }
  bool last_chunk(int chunk) const { return stage() == stages() - 1 && chunk == chunks_ - 1; }
  // The chunk on the next rank that this rank's chunk `chunk` feeds: the
  // same one, but the first rank's next one for the last rank (interleaved).
  int next_chunk(int chunk) const { return stage() == stages() - 1 ? chunk + 1 : chunk; }
  // The message tag of a microbatch's crossing out of or into a chunk: unique within a step.
  int tag(int microbatch, int chunk) const { return microbatch * chunks_ + chunk; }
  CommPtr group_;
  // This rank's links (null where there is none): activations in from the
  // rank before and out to the next, gradients in from the next and out to
  // the one before. In a link's communicator of two, the peer is 1 - rank().
  CommPtr activations_in_, activations_out_, gradients_in_, gradients_out_;
  CommPtr ends_;  // the first and the last stage (the tied embedding's holders); the others among themselves
  Schedule schedule_;
  int microbatches_;
  int chunks_;
  std::vector<Action> actions_;  // this rank's step, schedule_actions' order
  int max_in_flight_ = 0;
};

// GPT's tied head (dtrain/gpt_stage.h): the first and the last stage each
// hold wte; sums their gradients so that both copies take the step GPT's one
// wte takes. Collective over the pipeline's group (the other stages pass an
// undefined tensor and take part). No-op on one stage.
void sum_tied_gradients(const torch::Tensor& weight, const Pipeline& pipeline);

}  // namespace dtrain::pp
