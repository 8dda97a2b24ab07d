// FSDP with data-dependent control flow (issue 16, item 6; Note [reduction
// order] in src/fsdp/reduction_order.h): a model that routes samples so that
// on some ranks, in every step, a unit's parameters get no gradient (all of
// them, or some). Every rank must still issue its reductions in the same
// order, and training must equal single-process training on the global batch.
#include <dtrain/fsdp.h>

#include "../common/multirank_gtest.h"
#include "../ddp/ddp_test_support.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace {

using dtrain::Sharding;
using dtrain::testing::world;
using dtrain::testing::world_ptr;

constexpr int64_t kFeatures = 8, kHidden = 13, kClasses = 4, kGlobalBatch = 12;
constexpr int kSteps = 12;

// One unit holding two experts; the last input column routes each sample to
// expert a (positive) or b. On a rank whose batch routes nothing to b, b's
// parameters get no gradient: the unit is complete on some ranks and partial
// on others.
struct ExpertsImpl : torch::nn::Module {
  ExpertsImpl()
      : a(register_module("a", torch::nn::Linear(kHidden, kHidden))),
        b(register_module("b", torch::nn::Linear(kHidden, kHidden))) {}
  torch::Tensor forward(const torch::Tensor& input) {
    const auto h = input.narrow(1, 0, kHidden);
    const auto to_a = input.select(1, kHidden) > 0;
    const auto to_b = to_a.logical_not();
    auto out = torch::zeros_like(h);
    if (to_a.any().item<bool>()) out = out.index_put({to_a}, a->forward(h.index({to_a})));
    if (to_b.any().item<bool>()) out = out.index_put({to_b}, b->forward(h.index({to_b})));
    return out;
  }
  torch::nn::Linear a, b;
};
TORCH_MODULE(Experts);

// trunk -> experts -> (+ extra for samples whose second feature is
// negative) -> head. trunk, experts and extra are units; head is the
// root's. Every rank enters every unit (FSDP's all-gathers need all ranks),
// but a rank whose batch has no such sample discards extra's output: extra
// gets no gradient there.
struct RoutedImpl : torch::nn::Module {
  RoutedImpl()
      : trunk(torch::nn::Linear(kFeatures, kHidden).ptr()),
        experts(Experts().ptr()),
        extra(torch::nn::Linear(kHidden, kHidden).ptr()),
        head(torch::nn::Linear(kHidden, kClasses)) {
    register_module("trunk", trunk.ptr());
    register_module("experts", experts.ptr());
    register_module("extra", extra.ptr());
    register_module("head", head);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(trunk(x));
    auto out = experts(torch::cat({h, x.narrow(1, 0, 1)}, 1));
    auto more = extra(h);
    const auto wants_extra = x.select(1, 1) < 0;
    if (wants_extra.any().item<bool>()) {
      out = out.index_put({wants_extra}, out.index({wants_extra}) + more.index({wants_extra}));
    }
    return head->forward(torch::relu(out));
  }
  dtrain::Sharded<torch::nn::Linear> trunk;
  dtrain::Sharded<Experts> experts;
  dtrain::Sharded<torch::nn::Linear> extra;
  torch::nn::Linear head;
};
TORCH_MODULE(Routed);

// The global batch of `step`: one sample goes to expert b and another one
// wants extra; they sit on rank 0's part and on the last rank's, swapping
// every step, so at 2 and 3 ranks some ranks leave b and extra without
// gradients in every step (and the global batch never does).
ddp_test::Batch batch_for(int64_t step) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(700 + step);
  auto inputs = torch::rand({kGlobalBatch, kFeatures}, generator) + 0.1;
  const int64_t first = 1, last = kGlobalBatch - 2;
  inputs.index_put_({step % 2 == 0 ? first : last, 0}, -1.0);
  inputs.index_put_({step % 2 == 0 ? last : first, 1}, -1.0);
  auto targets = torch::randint(0, kClasses, {kGlobalBatch}, generator);
  return {inputs, targets};
}

std::map<std::string, torch::Tensor> named(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> result;
  for (const auto& item : module.named_parameters()) result[item.key()] = item.value().detach();
  return result;
}

class DataDependent : public ::testing::TestWithParam<Sharding> {};

TEST_P(DataDependent, UnitsUnusedOnSomeRanksMatchSingleProcess) {
  torch::manual_seed(5);
  Routed reference;
  torch::manual_seed(5);
  Routed replica;
  torch::optim::AdamW reference_optimizer(reference->parameters(), torch::optim::AdamWOptions(0.01));
  dtrain::FSDPOptions options;
  options.strategy = GetParam();
  const int n = world().size();
  options.hybrid_group_size = n % 2 == 0 && n > 2 ? 2 : n;
  auto fsdp = dtrain::fully_shard(replica, world_ptr(), options);
  torch::optim::AdamW optimizer(replica->parameters(), torch::optim::AdamWOptions(0.01));

  for (int step = 0; step < kSteps; ++step) {
    const auto batch = batch_for(step);
    reference_optimizer.zero_grad();
    auto reference_loss = torch::cross_entropy_loss(reference->forward(batch.inputs), batch.targets);
    reference_loss.backward();
    reference_optimizer.step();

    optimizer.zero_grad();
    const auto mine = ddp_test::local_part(batch, world());
    auto loss = torch::cross_entropy_loss(fsdp(mine.inputs), mine.targets);
    loss.backward();
    optimizer.step();
    auto global = torch::tensor({loss.item<double>()}, torch::kDouble);
    world().all_reduce(global, dtrain::ReduceOp::Avg)->wait();
    EXPECT_NEAR(global.item<double>(), reference_loss.item<double>(), 1e-5) << "step " << step;
  }
  const auto full = fsdp.full_state_dict(/*rank0_only=*/false);
  for (const auto& [name, value] : named(*reference)) {
    ASSERT_TRUE(full.count(name)) << name;
    EXPECT_LE((full.at(name) - value).abs().max().item<double>(), 1e-5) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, DataDependent,
                         ::testing::Values(Sharding::Full, Sharding::GradOp, Sharding::OptimizerOnly, Sharding::Hybrid),
                         [](const auto& info) { return std::string(dtrain::to_string(info.param)); });

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
