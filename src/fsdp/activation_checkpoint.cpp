#include "fsdp/activation_checkpoint.h"

#include "dtrain/attention.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

namespace dtrain::detail {
namespace {

// The generators a unit's forward may draw from (dropout): the CPU's and, for
// an input on a GPU, that GPU's. The recompute in backward must draw what the
// forward drew, so it runs from their states as they were then, and restores
// the states they have by then after it. (Through the generic at::Generator,
// so no CUDA header is needed here.)
std::vector<at::Generator> generators_for(const torch::Tensor& input) {
  std::vector<at::Generator> generators{at::detail::getDefaultCPUGenerator()};
  if (input.is_cuda()) generators.push_back(at::globalContext().defaultGenerator(input.device()));
  return generators;
}

std::vector<torch::Tensor> states_of(std::vector<at::Generator>& generators) {
  std::vector<torch::Tensor> states;
  for (auto& generator : generators) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    states.push_back(generator.get_state());
  }
  return states;
}

void set_states(std::vector<at::Generator>& generators, const std::vector<torch::Tensor>& states) {
  for (size_t i = 0; i < generators.size(); ++i) {
    std::lock_guard<std::mutex> lock(generators[i].mutex());
    generators[i].set_state(states[i]);
  }
}

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const std::shared_ptr<UnitForward>& unit_forward) {
    auto generators = generators_for(input);
    ctx->save_for_backward({input});
    ctx->saved_data["rng_states"] = states_of(generators);
    {
      std::lock_guard<std::mutex> lock(pending_mutex());
      pending().push_back(unit_forward);
      ctx->saved_data["forward"] = static_cast<int64_t>(pending().size() - 1);
    }
    torch::NoGradGuard no_grad;
    return (*unit_forward)(input);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto input = ctx->get_saved_variables()[0];
    const auto index = static_cast<size_t>(ctx->saved_data["forward"].toInt());
    std::shared_ptr<UnitForward> unit_forward;
    {
      std::lock_guard<std::mutex> lock(pending_mutex());
      unit_forward = pending().at(index);
      pending()[index].reset();
    }

    auto generators = generators_for(input);
    const std::vector<torch::Tensor> current = states_of(generators);
    set_states(generators, ctx->saved_data["rng_states"].toTensorVector());
    auto replay_input = input.detach().requires_grad_(input.requires_grad());
    torch::Tensor output;
    {
      torch::AutoGradMode enable_grad(true);
      output = (*unit_forward)(replay_input);
    }
    set_states(generators, current);
    torch::autograd::backward({output}, {grads[0]});
    return {input.requires_grad() ? replay_input.grad() : torch::Tensor(), torch::Tensor()};
  }

  // The forwards of checkpointed calls whose backward has not run, by index.
  // (AutogradContext::saved_data holds IValues, which cannot hold a
  // std::function.) Entries are dropped when their backward runs; the list
  // is cleared when no entry is pending. Backward may run on another thread.
  static std::vector<std::shared_ptr<UnitForward>>& pending() {
    static std::vector<std::shared_ptr<UnitForward>> forwards;
    return forwards;
  }
  static std::mutex& pending_mutex() {
    static std::mutex mutex;
    return mutex;
  }
};

}  // namespace

torch::Tensor checkpointed_forward(const UnitForward& forward, const torch::Tensor& input) {
  {
    std::lock_guard<std::mutex> lock(CheckpointFunction::pending_mutex());
    auto& pending = CheckpointFunction::pending();
    if (std::all_of(pending.begin(), pending.end(), [](const auto& f) { return !f; })) pending.clear();
  }
  // The recompute runs in the forward's sequence context (Note [sequence
  // context]), whatever is installed when backward runs: positions and
  // attention of sequence shards are the forward's.
  const models::SequenceContext* context = models::sequence_context();
  const UnitForward in_context = [forward, context](const torch::Tensor& x) {
    struct Installed {
      const models::SequenceContext* previous = models::sequence_context();
      explicit Installed(const models::SequenceContext* c) { models::set_sequence_context(c); }
      ~Installed() { models::set_sequence_context(previous); }
    } installed(context);
    return forward(x);
  };
  return CheckpointFunction::apply(input, std::make_shared<UnitForward>(in_context));
}

}  // namespace dtrain::detail
