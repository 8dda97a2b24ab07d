// FSDP equals single-process training on the global batch: 20 AdamW steps,
// same losses step by step, full parameters within 1e-5 (GPT: see
// tolerance()), for every sharding strategy, on an MLP, a CNN with
// SyncBatchNorm and a 4-layer GPT whose parameter counts do not divide by the
// world size; also with gradient accumulation (no_sync), with clipping, and
// the GPT under SGD with momentum (1e-6).
#include <dtrain/ddp.h>
#include <dtrain/fsdp.h>

#include "../common/multirank_gtest.h"
#include "../ddp/ddp_test_support.h"
#include "fsdp_test_models.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>

namespace {

using dtrain::Sharding;
using dtrain::testing::world;
using dtrain::testing::world_ptr;
using namespace fsdp_test;

constexpr int kSteps = 20;
constexpr int64_t kGlobalBatch = 12;

enum class Model { MLP, CNN, GPT };
enum class Variant { Plain, Accumulate, Clip, SGD, Checkpoint };  // AdamW except SGD, Checkpoint

std::string name_of(Model m) { return m == Model::MLP ? "MLP" : m == Model::CNN ? "CNN" : "GPT"; }
std::string name_of(Variant v) {
  switch (v) {
    case Variant::Plain: return "AdamW";
    case Variant::Accumulate: return "AdamW_Accumulate";
    case Variant::Clip: return "AdamW_Clip";
    case Variant::SGD: return "SGD";
    case Variant::Checkpoint: return "SGD_ActivationCheckpointing";
  }
  return "?";
}

dtrain::FSDPOptions options_for(Sharding strategy, Variant variant) {
  dtrain::FSDPOptions options;
  options.activation_checkpointing = variant == Variant::Checkpoint;
  options.strategy = strategy;
  // Hybrid: real groups of 2 at 4 ranks; otherwise one group.
  const int w = world().size();
  options.hybrid_group_size = (w % 2 == 0 && w > 2) ? 2 : w;
  return options;
}

ddp_test::Batch batch_for(Model model, int64_t step, int64_t size) {
  if (model != Model::GPT) return ddp_test::global_batch(step, size);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(500 + step);
  auto tokens = torch::randint(0, 256, {size, tiny_gpt_config().seq_len + 1}, generator);
  return {tokens.narrow(1, 0, tiny_gpt_config().seq_len), tokens.narrow(1, 1, tiny_gpt_config().seq_len)};
}

torch::Tensor loss_of(const torch::Tensor& logits, const torch::Tensor& targets) {
  if (logits.dim() == 3) return torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  return torch::cross_entropy_loss(logits, targets);
}

std::map<std::string, torch::Tensor> named(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> result;
  for (const auto& item : module.named_parameters()) result[item.key()] = item.value().detach();
  return result;
}

double max_abs_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// Trains `reference` (single process, whole batch) and `replica` (sharded,
// this rank's part) side by side; compares losses and final parameters.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(Variant variant, const std::vector<torch::Tensor>& params) {
  if (variant == Variant::SGD || variant == Variant::Checkpoint) {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.01).weight_decay(0.01));
}

// Largest allowed difference from single-process training after 20 steps.
// The GPT under AdamW misses 1e-5: elements whose gradient is itself
// O(1e-8) take full-size AdamW steps driven by rounding noise, so any two
// correct fp32 runs that sum gradients in a different order (any data
// parallelism; Sharding::None, i.e. DDP, shows the same) end up to 7e-5
// apart (measured at 2-4 ranks). Under SGD the same runs agree to 1.2e-7.
double tolerance(Model model, Variant variant) {
  const bool sgd = variant == Variant::SGD || variant == Variant::Checkpoint;
  if (model == Model::GPT && !sgd) return 1e-4;
  return model == Model::GPT ? 1e-6 : 1e-5;
}

template <class Holder>
void train_and_compare(Holder reference, Holder replica, Model model, Sharding strategy, Variant variant) {
  auto reference_optimizer = make_optimizer(variant, reference->parameters());
  dtrain::set_sync_batch_norm_comm(*replica, world_ptr());
  auto fsdp = dtrain::fully_shard(replica, world_ptr(), options_for(strategy, variant));
  auto optimizer = make_optimizer(variant, replica->parameters());
  const int micro_batches = variant == Variant::Accumulate ? 2 : 1;

  for (int step = 0; step < kSteps; ++step) {
    std::vector<ddp_test::Batch> micro;
    for (int m = 0; m < micro_batches; ++m) micro.push_back(batch_for(model, step * 10 + m, kGlobalBatch));

    reference_optimizer->zero_grad();
    double reference_loss = 0;
    for (const auto& b : micro) {
      torch::Tensor loss = loss_of(reference->forward(b.inputs), b.targets) / micro_batches;
      loss.backward();
      reference_loss += loss.item<double>();
    }
    if (variant == Variant::Clip) torch::nn::utils::clip_grad_norm_(reference->parameters(), 0.1);
    reference_optimizer->step();

    optimizer->zero_grad();
    double local_loss = 0;
    for (int m = 0; m < micro_batches; ++m) {
      const auto mine = ddp_test::local_part(micro[m], world());
      auto run = [&] {
        torch::Tensor loss = loss_of(fsdp(mine.inputs), mine.targets) / micro_batches;
        loss.backward();
        local_loss += loss.item<double>();
      };
      if (m + 1 < micro_batches) {
        auto guard = fsdp.no_sync();
        run();
      } else {
        run();
      }
    }
    if (variant == Variant::Clip) dtrain::clip_grad_norm(fsdp, 0.1);
    optimizer->step();

    auto global = torch::tensor({local_loss}, torch::kDouble);
    world().all_reduce(global, dtrain::ReduceOp::Avg)->wait();
    EXPECT_NEAR(global.item<double>(), reference_loss, 1e-5) << "step " << step;
  }

  const std::map<std::string, torch::Tensor> full = fsdp.full_state_dict(/*rank0_only=*/false);
  double worst = 0;
  std::string worst_name;
  const std::map<std::string, torch::Tensor> reference_parameters = named(*reference);
  for (const auto& [name, value] : reference_parameters) {
    auto it = full.find(name);
    if (it == full.end()) {
      ADD_FAILURE() << "full_state_dict lacks " << name;
      continue;
    }
    const double difference = max_abs_difference(it->second, value);
    if (difference > worst) {
      worst = difference;
      worst_name = name;
    }
  }
  EXPECT_LE(worst, tolerance(model, variant)) << "largest difference in " << worst_name;
}

class Equivalence : public ::testing::TestWithParam<std::tuple<Sharding, Model, Variant>> {};

// The key third of each qkv bias gets a gradient that is zero up to rounding
// (softmax ignores a constant added to a whole row of scores); AdamW turns
// that rounding noise into full-size steps in any two runs that sum in a
// different order. Freezing the biases keeps the comparison meaningful (and
// tests frozen parameters inside sharded units).
void freeze_qkv_biases(torch::nn::Module& model) {
  for (auto& item : model.named_parameters()) {
    if (item.key().ends_with("qkv.bias")) item.value().set_requires_grad(false);
  }
}

TEST_P(Equivalence, MatchesSingleProcess) {
  const auto [strategy, model, variant] = GetParam();
  if (model == Model::GPT) {
    torch::manual_seed(3);
    dtrain::models::GPT reference(tiny_gpt_config());
    torch::manual_seed(3 + world().rank());  // DDP-style broadcast from rank 0 must fix this
    dtrain::models::GPT replica(tiny_gpt_config());
    freeze_qkv_biases(*reference);
    freeze_qkv_biases(*replica);
    train_and_compare(reference, replica, model, strategy, variant);
  } else {
    auto make = model == Model::MLP ? make_mlp : make_cnn;
    torch::manual_seed(3);
    auto reference = make();
    torch::manual_seed(3 + world().rank());
    auto replica = make();
    train_and_compare(reference, replica, model, strategy, variant);
  }
}

std::string case_name(const ::testing::TestParamInfo<Equivalence::ParamType>& info) {
  const auto [strategy, model, variant] = info.param;
  return std::string(dtrain::to_string(strategy)) + "_" + name_of(model) + "_" + name_of(variant);
}

INSTANTIATE_TEST_SUITE_P(Strategies, Equivalence,
                         ::testing::Combine(::testing::Values(Sharding::Full, Sharding::GradOp,
                                                              Sharding::OptimizerOnly, Sharding::None,
                                                              Sharding::Hybrid),
                                            ::testing::Values(Model::MLP, Model::CNN, Model::GPT),
                                            ::testing::Values(Variant::Plain)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Variants, Equivalence,
                         ::testing::Combine(::testing::Values(Sharding::Full, Sharding::GradOp,
                                                              Sharding::OptimizerOnly, Sharding::Hybrid),
                                            ::testing::Values(Model::MLP, Model::GPT),
                                            ::testing::Values(Variant::Accumulate, Variant::Clip)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Exactness, Equivalence,
                         ::testing::Combine(::testing::Values(Sharding::Full, Sharding::GradOp,
                                                              Sharding::OptimizerOnly, Sharding::None,
                                                              Sharding::Hybrid),
                                            ::testing::Values(Model::GPT),
                                            ::testing::Values(Variant::SGD, Variant::Checkpoint)),
                         case_name);

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }

