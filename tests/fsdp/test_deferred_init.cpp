// Deferred construction (include/dtrain/deferred_init.h, issue 15): a model
// built without the memory of its weights, then materialised by
// fully_shard unit by unit into this rank's shards, has exactly the weights
// of a plain construction with the same seed, at any world size and
// strategy, and no rank ever holds more than its shards plus one module.
#include <dtrain/ddp.h>
#include <dtrain/deferred_init.h>
#include <dtrain/fsdp.h>
#include <dtrain/memory.h>
#include <dtrain/models.h>

#include "../common/multirank_gtest.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace {

using dtrain::Sharding;
using dtrain::testing::world;
using dtrain::testing::world_ptr;

dtrain::models::GPTConfig gpt_config() {
  dtrain::models::GPTConfig config;
  config.seq_len = 16;
  config.n_layer = 3;
  config.n_embd = 48;
  config.n_head = 4;
  return config;
}

std::map<std::string, torch::Tensor> state_of(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> state;
  for (const auto& item : module.named_parameters(true)) state[item.key()] = item.value().detach().clone();
  for (const auto& item : module.named_buffers(true)) state[item.key()] = item.value().detach().clone();
  return state;
}

void expect_same_state(const std::map<std::string, torch::Tensor>& expected,
                       const std::map<std::string, torch::Tensor>& actual, const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  for (const auto& [name, tensor] : expected) {
    auto it = actual.find(name);
    ASSERT_NE(it, actual.end()) << what << ": " << name;
    EXPECT_TRUE(torch::equal(tensor, it->second)) << what << ": " << name << " differs";
  }
}

template <class Build>
std::shared_ptr<torch::nn::Module> build_deferred(Build build) {
  dtrain::DeferredConstruction deferred;
  return build();
}

TEST(DeferredConstruction, HoldsNoStorageAndForwardNamesTheFix) {
  dtrain::memory::install_tracking_allocator();
  const int64_t before = dtrain::memory::live_bytes();
  torch::manual_seed(3);
  dtrain::models::GPT model{nullptr};
  {
    dtrain::DeferredConstruction deferred;
    model = dtrain::models::GPT(gpt_config());
  }
  EXPECT_EQ(dtrain::memory::live_bytes(), before) << "a deferred model holds no tensor bytes";
  EXPECT_TRUE(dtrain::has_deferred_storage(*model));
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(dtrain::is_deferred(item.value())) << item.key();
    EXPECT_GT(item.value().numel(), 0) << item.key() << " keeps its shape";
  }
  try {
    model->forward(torch::zeros({1, 4}, torch::kLong));
    FAIL() << "forward ran on a model without weights";
  } catch (const std::logic_error& error) {
    EXPECT_NE(std::string(error.what()).find("dtrain::materialize"), std::string::npos) << error.what();
  }
}

TEST(DeferredConstruction, MaterializeEqualsPlainConstruction) {
  std::vector<std::pair<std::string, std::function<std::shared_ptr<torch::nn::Module>()>>> builders = {
      {"gpt", [] { return dtrain::models::GPT(gpt_config()).ptr(); }},
      {"mlp", [] { return dtrain::models::MLP(std::vector<int64_t>{33, 17}).ptr(); }},
      {"cnn", [] { return dtrain::models::CNN().ptr(); }},
  };
  for (const auto& [name, build] : builders) {
    torch::manual_seed(11);
    auto plain = build();
    torch::manual_seed(11);
    auto deferred = build_deferred(build);
    ASSERT_TRUE(dtrain::has_deferred_storage(*deferred)) << name;
    dtrain::materialize(*deferred);
    EXPECT_FALSE(dtrain::has_deferred_storage(*deferred)) << name;
    expect_same_state(state_of(*plain), state_of(*deferred), name);
    torch::manual_seed(12);
    auto other_seed = build();
    bool any_differs = false;
    const auto other = state_of(*other_seed);
    for (const auto& [key, tensor] : state_of(*plain)) any_differs = any_differs || !torch::equal(tensor, other.at(key));
    EXPECT_TRUE(any_differs) << name << ": the seed must still decide the weights";
  }
}

// Every strategy, every world size: the gathered state of a deferred model
// is the plain model's. Each rank seeds differently, so rank 0's init seed
// must win (as rank 0's weights win for a built model).
TEST(DeferredConstruction, FullyShardEqualsPlainModelWithRankZerosSeed) {
  dtrain::memory::install_tracking_allocator();
  torch::manual_seed(7);
  auto plain = dtrain::models::GPT(gpt_config());
  const auto expected = state_of(*plain);
  int64_t largest_module_bytes = 0;
  for (const auto& module : plain->modules(false)) {
    int64_t bytes = 0;
    for (const auto& p : module->parameters(false)) bytes += p.numel() * 4;
    largest_module_bytes = std::max(largest_module_bytes, bytes);
  }
  const int n = world().size();
  for (auto strategy : {Sharding::Full, Sharding::GradOp, Sharding::OptimizerOnly, Sharding::Hybrid}) {
    torch::manual_seed(7 + 100 * world().rank());
    dtrain::models::GPT model{nullptr};
    {
      dtrain::DeferredConstruction deferred;
      model = dtrain::models::GPT(gpt_config());
    }
    const int64_t live_before = dtrain::memory::live_bytes();
    dtrain::memory::reset_peak();
    dtrain::FSDPOptions options;
    options.strategy = strategy;
    options.hybrid_group_size = n % 2 == 0 ? n / 2 : n;
    auto fsdp = dtrain::fully_shard(model, world_ptr(), options);
    const std::string what = std::string(dtrain::to_string(strategy)) + " on " + std::to_string(n) + " ranks";
    // The start's peak: this rank's shards, plus one module at full size
    // (and a few KiB of rank agreement).
    int64_t shard_bytes = 0;
    for (const auto& unit : fsdp.units()) shard_bytes += unit.shard_numel * 4;
    EXPECT_LE(dtrain::memory::peak_bytes() - live_before, shard_bytes + largest_module_bytes + 64 * 1024) << what;
    EXPECT_FALSE(dtrain::has_deferred_storage(*model)) << what;
    expect_same_state(expected, fsdp.full_state_dict(/*rank0_only=*/false), what);
  }
}

// A module of one's own: a raw parameter on the root, initialised by the
// model's init_module, in both the plain and the deferred path.
struct ScaledImpl : torch::nn::Module, dtrain::DeferredInit {
  ScaledImpl() {
    scale = register_parameter("scale", torch::empty({5}));
    fc = register_module("fc", dtrain::deferred(torch::nn::Linear(5, 3)));
    if (dtrain::constructing_deferred()) dtrain::defer_storage(*this);
    initialize_unless_deferred(*this);
  }
  void init_module(const std::string& name, torch::nn::Module& module, at::Generator& generator) override {
    torch::NoGradGuard no_grad;
    if (name.empty()) {
      scale.uniform_(2.0, 3.0, generator);
    } else {
      dtrain::default_init(module, generator);
    }
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc->forward(x * scale); }
  torch::Tensor scale;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Scaled);

TEST(DeferredConstruction, OwnModelFollowsTheContract) {
  torch::manual_seed(21);
  Scaled plain;
  EXPECT_GE(plain->scale.min().item<float>(), 2.0f) << "init_module ran in the plain construction";
  torch::manual_seed(21);
  Scaled model{nullptr};
  {
    dtrain::DeferredConstruction deferred;
    model = Scaled();
  }
  auto fsdp = dtrain::fully_shard(model, world_ptr());
  expect_same_state(state_of(*plain), fsdp.full_state_dict(false), "own model");
}

struct NoContractImpl : torch::nn::Module {
  NoContractImpl() { fc = register_module("fc", dtrain::deferred(torch::nn::Linear(4, 4))); }
  torch::Tensor forward(const torch::Tensor& x) { return fc->forward(x); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(NoContract);

TEST(DeferredConstruction, ModelWithoutTheContractIsNamed) {
  NoContract model{nullptr};
  {
    dtrain::DeferredConstruction deferred;
    model = NoContract();
  }
  try {
    auto fsdp = dtrain::fully_shard(model, world_ptr());
    FAIL() << "a deferred module nobody can initialise was accepted";
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'fc'"), std::string::npos) << message;
    EXPECT_NE(message.find("DeferredInit"), std::string::npos) << message;
  }
}

TEST(DeferredConstruction, DataParallelBuildsTheWholeReplica) {
  torch::manual_seed(31);
  auto plain = dtrain::models::GPT(gpt_config());
  torch::manual_seed(31);
  dtrain::models::GPT model{nullptr};
  {
    dtrain::DeferredConstruction deferred;
    model = dtrain::models::GPT(gpt_config());
  }
  dtrain::DistributedDataParallelBase ddp(model.ptr(), world_ptr(), {});
  expect_same_state(state_of(*plain), state_of(*model), "ddp");
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
