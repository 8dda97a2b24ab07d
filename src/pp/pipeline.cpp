// Pipeline schedules (include/dtrain/pipeline.h): a step's forwards and
// backwards in the order schedule_actions gives (GPipe, 1F1B, interleaved),
// activations and gradients point to point over each link between stages.
#include "dtrain/pipeline.h"

#include "dtrain/trace.h"

#include <torch/autograd.h>

#include <algorithm>
#include <deque>
#include <iterator>
#include <stdexcept>

namespace dtrain::pp {

std::vector<StageBlocks> divide_blocks(int64_t blocks, int stages, const std::vector<int64_t>& split) {
  if (stages < 1) throw std::invalid_argument("pipeline: " + std::to_string(stages) + " stages; need at least 1");
  if (blocks < stages)
    throw std::invalid_argument("pipeline: " + std::to_string(blocks) + " blocks cannot fill " + std::to_string(stages) +
                                " stages (each stage needs a block)");
  std::vector<int64_t> counts = split;
  if (counts.empty()) {
    for (int s = 0; s < stages; ++s) counts.push_back(blocks / stages + (s < blocks % stages ? 1 : 0));
  }
  if (static_cast<int>(counts.size()) != stages)
    throw std::invalid_argument("pipeline: a split of " + std::to_string(counts.size()) + " stages for " +
                                std::to_string(stages) + " stages");
  std::vector<StageBlocks> out;
  int64_t first = 0;
  for (int64_t count : counts) {
    if (count < 1) throw std::invalid_argument("pipeline: a split gives a stage " + std::to_string(count) + " blocks");
    out.push_back({first, first + count});
    first += count;
  }
  if (first != blocks)
    throw std::invalid_argument("pipeline: the split holds " + std::to_string(first) + " blocks, the model has " +
                                std::to_string(blocks));
  return out;
}

Pipeline::Pipeline(CommPtr group, Schedule schedule, int microbatches, int chunks)
    : group_(std::move(group)),
      schedule_(schedule),
      microbatches_(microbatches),
      chunks_(chunks),
      // Refuses what cannot run before any split, on every rank alike.
      actions_(schedule_actions(schedule, group_->rank(), group_->size(), chunks, microbatches)) {
  const int rank = group_->rank(), P = group_->size(), last = P - 1;
  // Link i carries stage i's output to stage i + 1 (the last link, P-1 to 0,
  // only when interleaved). Its communicators have the sender as rank 0 and
  // the receiver as rank 1; every rank takes part in every split.
  const int links = chunks > 1 ? P : P - 1;
  for (int i = 0; i < links; ++i) {
    const int sender = i, receiver = (i + 1) % P;
    const bool member = rank == sender || rank == receiver;
    const int color = member ? 0 : -1, key = rank == sender ? 0 : 1;
    CommPtr activations = group_->split(color, key);
    CommPtr gradients = group_->split(color, key);
    if (rank == sender) activations_out_ = activations, gradients_in_ = gradients;
    if (rank == receiver) activations_in_ = activations, gradients_out_ = gradients;
  }
  ends_ = group_->split(rank == 0 || rank == last ? 0 : 1, rank);
}

namespace {

// One microbatch in one chunk of this stage: what it received (the
// activation, whose gradient goes back) and what it produced (whose
// gradient comes in).
struct InFlight {
  torch::Tensor input, output;
};

// The samples per microbatch; throws when the batch does not split evenly.
int64_t microbatch_size(const torch::Tensor& inputs, int microbatches) {
  if (inputs.size(0) % microbatches != 0)
    throw std::invalid_argument("pipeline: a batch of " + std::to_string(inputs.size(0)) + " does not split into " +
                                std::to_string(microbatches) + " microbatches");
  return inputs.size(0) / microbatches;
}

// The last stage's `value`, on every stage of `group`.
double from_the_last_stage(const CommPtr& group, double value) {
  auto total = torch::tensor({group->rank() == group->size() - 1 ? value : 0.0}, torch::kFloat64);
  group->blocking().all_reduce(total, ReduceOp::Sum);
  return total.item<double>();
}

// The other end of a link's communicator of two.
int peer(const CommPtr& link) { return 1 - link->rank(); }

}  // namespace

double Pipeline::step(const ChunkForward& forward, const StageLoss& loss, const torch::Tensor& inputs,
                      const torch::Tensor& targets, const std::vector<int64_t>& activation_shape,
                      torch::ScalarType dtype, const BackwardRunner& run_backward_with) {
  const int M = microbatches_;
  const int64_t micro = microbatch_size(inputs, M);
  const auto options = torch::TensorOptions().dtype(dtype);
  // Per chunk: forwarded, not yet backwarded, oldest first (both run a
  // chunk's microbatches in increasing order).
  std::vector<std::deque<InFlight>> in_flight(static_cast<size_t>(chunks_));
  int alive = 0;
  // Sends in flight, oldest first; each holds its tensor until it completes.
  // Completed ones are dropped as the step goes, so that 1F1B's bound on
  // live activations holds for what is sent too (not M outputs until the end).
  std::deque<WorkPtr> sends;
  const auto drop_completed_sends = [&] {
    while (!sends.empty() && sends.front()->is_completed()) sends.pop_front();
  };
  double loss_sum = 0;
  max_in_flight_ = 0;

  auto run_forward = [&](int k, int m) {
    InFlight f;
    if (first_chunk(k)) {
      f.input = inputs.narrow(0, m * micro, micro);
    } else {
      f.input = torch::empty(activation_shape, options);
      trace::Span waiting("pp_recv_activation", trace::category::wait, {{"microbatch", m}, {"chunk", k}});
      activations_in_->recv(f.input, peer(activations_in_), tag(m, k))->wait();
      f.input.requires_grad_(true);
    }
    trace::Span computing("pp_forward", trace::category::compute, {{"microbatch", m}, {"chunk", k}});
    f.output = forward(k, f.input);
    if (last_chunk(k)) {
      // Each microbatch's share of the batch mean.
      f.output = loss(f.output, targets.narrow(0, m * micro, micro)) / static_cast<double>(M);
      loss_sum += f.output.item<double>();
    } else {
      sends.push_back(activations_out_->send(f.output.detach().to(dtype).contiguous(), peer(activations_out_),
                                             tag(m, next_chunk(k))));
    }
    in_flight[static_cast<size_t>(k)].push_back(std::move(f));
    max_in_flight_ = std::max(max_in_flight_, ++alive);
  };
  auto run_backward = [&](int k, int m, bool last_in_step) {
    auto& chunk = in_flight[static_cast<size_t>(k)];
    InFlight f = std::move(chunk.front());
    chunk.pop_front();
    --alive;
    torch::Tensor gradient;  // of the output: none on the last chunk (it is the loss)
    if (!last_chunk(k)) {
      // Gradients cross in the activations' dtype too (Note [stage dtype]).
      gradient = torch::empty(f.output.sizes(), options.device(f.output.device()));
      trace::Span waiting("pp_recv_gradient", trace::category::wait, {{"microbatch", m}, {"chunk", k}});
      gradients_in_->recv(gradient, peer(gradients_in_), tag(m, next_chunk(k)))->wait();
      gradient = gradient.to(f.output.scalar_type());
    }
    trace::Span computing("pp_backward", trace::category::compute, {{"microbatch", m}, {"chunk", k}});
    const auto backward = [&] { last_chunk(k) ? f.output.backward() : f.output.backward(gradient); };
    if (run_backward_with) {
      run_backward_with(last_in_step, backward);
    } else {
      backward();
    }
    if (!first_chunk(k))
      sends.push_back(gradients_out_->send(f.input.grad().to(dtype).contiguous(), peer(gradients_out_), tag(m, k)));
    drop_completed_sends();
  };

  const auto last_backward = std::find_if(actions_.rbegin(), actions_.rend(), [](const Action& a) { return !a.forward; });
  for (auto a = actions_.begin(); a != actions_.end(); ++a) {
    if (a->forward) {
      run_forward(a->chunk, a->microbatch);
    } else {
      run_backward(a->chunk, a->microbatch, a == std::prev(last_backward.base()));
    }
  }
  {
    trace::Span waiting("pp_send_drain", trace::category::wait);
    for (auto& work : sends) work->wait();
  }
  return from_the_last_stage(group_, loss_sum);  // the loss lives on the last stage
}

double Pipeline::step(const StageForward& forward, const StageLoss& loss, const torch::Tensor& inputs,
                      const torch::Tensor& targets, const std::vector<int64_t>& activation_shape,
                      torch::ScalarType dtype, const BackwardRunner& run_backward) {
  return step([&](int, const torch::Tensor& x) { return forward(x); }, loss, inputs, targets, activation_shape, dtype,
              run_backward);
}

double Pipeline::evaluate(const ChunkForward& forward, const StageLoss& loss, const torch::Tensor& inputs,
                          const torch::Tensor& targets, std::vector<int64_t> activation_shape,
                          torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  const int64_t batch = inputs.size(0), M = microbatches_;
  std::vector<WorkPtr> sends;
  double sum = 0;
  int64_t begin = 0;
  for (int64_t m = 0; m < M; ++m) {
    // Empty microbatches run too (without messages: every stage knows the
    // size), so that the ranks of a data-parallel group, whose parts may
    // differ by a sample, run the same number of forwards and so issue the
    // same collectives. They run on a one-sample stand-in of zeros whose
    // output is dropped: a model never sees an empty batch, which CUDA
    // kernels may refuse (Note [no empty batches], src/train/model.cpp).
    const int64_t size = batch / M + (m < batch % M ? 1 : 0);
    const int mb = static_cast<int>(m);
    for (int k = 0; k < chunks_; ++k) {
      torch::Tensor input;
      if (first_chunk(k)) {
        input = size > 0 ? inputs.narrow(0, begin, size) : torch::zeros({1, inputs.size(1)}, inputs.options());
      } else {
        activation_shape.at(0) = std::max<int64_t>(size, 1);
        input = torch::empty(activation_shape, torch::TensorOptions().dtype(dtype));
        if (size > 0) {
          activations_in_->recv(input, peer(activations_in_), tag(mb, k))->wait();
        } else {
          input.zero_();
        }
      }
      const torch::Tensor output = forward(k, input);
      if (size == 0) continue;
      if (last_chunk(k)) {
        sum += loss(output, targets.narrow(0, begin, size)).item<double>();
      } else {
        sends.push_back(activations_out_->send(output.to(dtype).contiguous(), peer(activations_out_),
                                               tag(mb, next_chunk(k))));
      }
    }
    begin += size;
  }
  for (auto& work : sends) work->wait();
  return from_the_last_stage(group_, sum);
}

double Pipeline::evaluate(const StageForward& forward, const StageLoss& loss, const torch::Tensor& inputs,
                          const torch::Tensor& targets, std::vector<int64_t> activation_shape,
                          torch::ScalarType dtype) {
  return evaluate([&](int, const torch::Tensor& x) { return forward(x); }, loss, inputs, targets,
                  std::move(activation_shape), dtype);
}

torch::Tensor Pipeline::infer(const ChunkForward& forward, const torch::Tensor& inputs,
                              const std::vector<int64_t>& activation_shape, const std::vector<int64_t>& output_shape,
                              torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  torch::Tensor output;
  for (int k = 0; k < chunks_; ++k) {
    torch::Tensor input = inputs;
    if (!first_chunk(k)) {
      input = torch::empty(activation_shape, torch::TensorOptions().dtype(dtype));
      activations_in_->recv(input, peer(activations_in_), tag(0, k))->wait();
    }
    output = forward(k, input).to(dtype).contiguous();
    if (!last_chunk(k)) activations_out_->send(output, peer(activations_out_), tag(0, next_chunk(k)))->wait();
  }
  if (stage() < stages() - 1) output = torch::empty(output_shape, torch::TensorOptions().dtype(dtype));
  group_->blocking().broadcast(output, stages() - 1);
  return output;
}

torch::Tensor Pipeline::infer(const StageForward& forward, const torch::Tensor& inputs,
                              const std::vector<int64_t>& activation_shape, const std::vector<int64_t>& output_shape,
                              torch::ScalarType dtype) {
  return infer([&](int, const torch::Tensor& x) { return forward(x); }, inputs, activation_shape, output_shape, dtype);
}

void sum_tied_gradients(const torch::Tensor& weight, const Pipeline& pipeline) {
  const int s = pipeline.stage(), last = pipeline.stages() - 1;
  if (last == 0 || (s != 0 && s != last)) return;
  if (!weight.defined() || !weight.grad().defined())
    throw std::invalid_argument("pp::sum_tied_gradients: the first and last stage must pass the tied weight after backward");
  pipeline.ends_->blocking().all_reduce(weight.mutable_grad(), ReduceOp::Sum);
}

}  // namespace dtrain::pp
