// Pipeline schedules (include/dtrain/pipeline.h): GPipe and 1F1B over the
// stages of a group, activations and gradients point to point.
#include "dtrain/pipeline.h"

#include "dtrain/trace.h"

#include <torch/autograd.h>

#include <algorithm>
#include <deque>
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

Schedule schedule_from(const std::string& name) {
  if (name == "gpipe") return Schedule::GPipe;
  if (name == "1f1b") return Schedule::OneFOneB;
  throw std::invalid_argument("pipeline schedule '" + name + "' is not one of gpipe, 1f1b");
}

std::string schedule_name(Schedule schedule) { return schedule == Schedule::GPipe ? "gpipe" : "1f1b"; }

Pipeline::Pipeline(CommPtr group, Schedule schedule, int microbatches)
    : group_(std::move(group)), schedule_(schedule), microbatches_(microbatches) {
  if (microbatches < 1)
    throw std::invalid_argument("pipeline: " + std::to_string(microbatches) + " microbatches; need at least 1");
  const int rank = group_->rank(), last = group_->size() - 1;
  forward_channel_ = group_->split(0, rank);
  backward_channel_ = group_->split(0, rank);
  ends_ = group_->split(rank == 0 || rank == last ? 0 : 1, rank);
}

namespace {

// One microbatch on this stage: what it received (the activation, whose
// gradient goes back) and what it produced (whose gradient comes in).
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

}  // namespace

double Pipeline::step(const StageForward& forward, const StageLoss& loss, const torch::Tensor& inputs,
                      const torch::Tensor& targets, const std::vector<int64_t>& activation_shape,
                      torch::ScalarType dtype, const BackwardRunner& run_backward_with) {
  const int s = stage(), P = stages(), M = microbatches_;
  const bool first = s == 0, last = s == P - 1;
  const int64_t micro = microbatch_size(inputs, M);
  const auto options = torch::TensorOptions().dtype(dtype);
  std::deque<InFlight> in_flight;  // forwarded, not yet backwarded, oldest first
  // Sends in flight, oldest first; each holds its tensor until it completes.
  // Completed ones are dropped as the step goes, so that 1F1B's bound on
  // live activations holds for what is sent too (not M outputs until the end).
  std::deque<WorkPtr> sends;
  const auto drop_completed_sends = [&] {
    while (!sends.empty() && sends.front()->is_completed()) sends.pop_front();
  };
  double loss_sum = 0;
  max_in_flight_ = 0;

  auto run_forward = [&](int m) {
    InFlight f;
    if (first) {
      f.input = inputs.narrow(0, m * micro, micro);
    } else {
      f.input = torch::empty(activation_shape, options);
      trace::Span waiting("pp_recv_activation", trace::category::wait, {{"microbatch", m}});
      forward_channel_->recv(f.input, s - 1, m)->wait();
      f.input.requires_grad_(true);
    }
    trace::Span computing("pp_forward", trace::category::compute, {{"microbatch", m}});
    f.output = forward(f.input);
    if (last) {
      // Each microbatch's share of the batch mean.
      f.output = loss(f.output, targets.narrow(0, m * micro, micro)) / static_cast<double>(M);
      loss_sum += f.output.item<double>();
    } else {
      sends.push_back(forward_channel_->send(f.output.detach().to(dtype).contiguous(), s + 1, m));
    }
    in_flight.push_back(std::move(f));
    max_in_flight_ = std::max<int>(max_in_flight_, static_cast<int>(in_flight.size()));
  };
  auto run_backward = [&](int m) {
    InFlight f = std::move(in_flight.front());
    in_flight.pop_front();
    torch::Tensor gradient;  // of the output: none on the last stage (it is the loss)
    if (!last) {
      // Gradients cross in the activations' dtype too (Note [stage dtype]).
      gradient = torch::empty(f.output.sizes(), options.device(f.output.device()));
      trace::Span waiting("pp_recv_gradient", trace::category::wait, {{"microbatch", m}});
      backward_channel_->recv(gradient, s + 1, m)->wait();
      gradient = gradient.to(f.output.scalar_type());
    }
    trace::Span computing("pp_backward", trace::category::compute, {{"microbatch", m}});
    const auto backward = [&] { last ? f.output.backward() : f.output.backward(gradient); };
    if (run_backward_with) {
      run_backward_with(m == M - 1, backward);
    } else {
      backward();
    }
    if (!first) sends.push_back(backward_channel_->send(f.input.grad().to(dtype).contiguous(), s - 1, m));
    drop_completed_sends();
  };

  if (schedule_ == Schedule::GPipe) {
    for (int m = 0; m < M; ++m) run_forward(m);
    for (int m = 0; m < M; ++m) run_backward(m);
  } else {
    const int warmup = std::min(P - s - 1, M);
    for (int m = 0; m < warmup; ++m) run_forward(m);
    for (int m = warmup; m < M; ++m) {
      run_forward(m);
      run_backward(m - warmup);
    }
    for (int m = M - warmup; m < M; ++m) run_backward(m);
  }
  {
    trace::Span waiting("pp_send_drain", trace::category::wait);
    for (auto& work : sends) work->wait();
  }
  return from_the_last_stage(group_, loss_sum);  // the loss lives on the last stage
}

double Pipeline::evaluate(const StageForward& forward, const StageLoss& loss, const torch::Tensor& inputs,
                          const torch::Tensor& targets, std::vector<int64_t> activation_shape,
                          torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  const int s = stage(), P = stages();
  const bool first = s == 0, last = s == P - 1;
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
    torch::Tensor input;
    if (first) {
      input = size > 0 ? inputs.narrow(0, begin, size) : torch::zeros({1, inputs.size(1)}, inputs.options());
    } else {
      activation_shape.at(0) = std::max<int64_t>(size, 1);
      input = torch::empty(activation_shape, torch::TensorOptions().dtype(dtype));
      if (size > 0) {
        forward_channel_->recv(input, s - 1, static_cast<int>(m))->wait();
      } else {
        input.zero_();
      }
    }
    const torch::Tensor output = forward(input);
    if (size == 0) continue;
    if (last) {
      sum += loss(output, targets.narrow(0, begin, size)).item<double>();
    } else {
      sends.push_back(forward_channel_->send(output.to(dtype).contiguous(), s + 1, static_cast<int>(m)));
    }
    begin += size;
  }
  for (auto& work : sends) work->wait();
  return from_the_last_stage(group_, sum);
}

torch::Tensor Pipeline::infer(const StageForward& forward, const torch::Tensor& inputs,
                              const std::vector<int64_t>& activation_shape, const std::vector<int64_t>& output_shape,
                              torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  const int s = stage(), P = stages();
  torch::Tensor input = inputs;
  if (s > 0) {
    input = torch::empty(activation_shape, torch::TensorOptions().dtype(dtype));
    forward_channel_->recv(input, s - 1, 0)->wait();
  }
  torch::Tensor output = forward(input).to(dtype).contiguous();
  if (s < P - 1) {
    forward_channel_->send(output, s + 1, 0)->wait();
    output = torch::empty(output_shape, torch::TensorOptions().dtype(dtype));
  }
  group_->blocking().broadcast(output, P - 1);
  return output;
}

void sum_tied_gradients(const torch::Tensor& weight, const Pipeline& pipeline) {
  const int s = pipeline.stage(), last = pipeline.stages() - 1;
  if (last == 0 || (s != 0 && s != last)) return;
  if (!weight.defined() || !weight.grad().defined())
    throw std::invalid_argument("pp::sum_tied_gradients: the first and last stage must pass the tied weight after backward");
  pipeline.ends_->blocking().all_reduce(weight.mutable_grad(), ReduceOp::Sum);
}

}  // namespace dtrain::pp
