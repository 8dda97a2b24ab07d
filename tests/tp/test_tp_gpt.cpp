// The tensor-parallel GPT (include/dtrain/tp_gpt.h) on every (dp, tp) mesh
// the world size allows, with DDP and with FSDP (built deferred) over dp,
// equals single-process training of the plain GPT on the same global batch:
// the same initial numbers (bitwise slices), the same loss at every step
// (1e-5), the same parameters at the end (FSDP equivalence tolerances:
// 1e-4 under AdamW, 1e-6 under SGD with momentum; see
// tests/fsdp/test_fsdp_equivalence.cpp for why AdamW needs more). And the
// checkpoint each mesh saves (dtrain::held_on_mesh), read back whole on one
// process, is the single-process model's checkpoint: every parameter and
// optimizer state within the same tolerances, the step counts equal; loading
// it on the same mesh restores every rank's pieces bitwise.
#include <dtrain/checkpoint.h>
#include <dtrain/ddp.h>
#include <dtrain/fsdp.h>
#include <dtrain/mesh.h>
#include <dtrain/models.h>
#include <dtrain/tp_gpt.h>

#include "../common/multirank_gtest.h"

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

namespace {

using dtrain::DeviceMesh;
using dtrain::testing::world;
using dtrain::testing::world_ptr;
namespace models = dtrain::models;
namespace tp = dtrain::tp;

constexpr int kSteps = 8;
constexpr int64_t kGlobalBatch = 12;  // splits evenly for dp = 1..4

models::GPTConfig config() {
  models::GPTConfig c;
  c.vocab_size = 24;  // splits for tp = 1..4
  c.seq_len = 8;
  c.n_layer = 2;
  c.n_embd = 48;
  c.n_head = 12;  // 4-wide heads; splits for tp = 1..4
  return c;
}

bool ends_with(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

// The part of the plain GPT's parameter `name` that tp rank r of n holds.
torch::Tensor slice_of(const std::string& name, const torch::Tensor& full, int r, int n) {
  auto column = [&](int64_t sections) {
    return full.dim() == 2 ? tp::column_slice(full, r, n, sections)
                           : tp::column_slice(full.unsqueeze(1), r, n, sections).squeeze(1);
  };
  if (ends_with(name, ".qkv.weight") || ends_with(name, ".qkv.bias")) return column(3);
  if (ends_with(name, ".mlp_fc.weight") || ends_with(name, ".mlp_fc.bias")) return column(1);
  if (ends_with(name, "proj.weight")) return tp::row_slice(full, r, n);  // attn_proj, mlp_proj
  if (name == "wte.weight") return full.narrow(0, r * full.size(0) / n, full.size(0) / n);
  return full;  // wpe, LayerNorms, the row layers' biases: replicated
}

std::map<std::string, torch::Tensor> named(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : module.named_parameters()) out[item.key()] = item.value().detach();
  return out;
}

struct Batch {
  torch::Tensor inputs, targets;
};
Batch batch(int step) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(700 + step);
  auto tokens = torch::randint(0, config().vocab_size, {kGlobalBatch, config().seq_len + 1}, generator);
  return {tokens.narrow(1, 0, config().seq_len), tokens.narrow(1, 1, config().seq_len)};
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(bool sgd, const std::vector<torch::Tensor>& parameters) {
  if (sgd) return std::make_unique<torch::optim::SGD>(parameters, torch::optim::SGDOptions(0.05).momentum(0.9));
  return std::make_unique<torch::optim::AdamW>(parameters, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
}

TEST(TPGPT, InitialWeightsAreSlicesOfThePlainGPT) {
  for (int tp_size = 1; tp_size <= world().size(); ++tp_size) {
    if (world().size() % tp_size != 0) continue;
    DeviceMesh mesh(world_ptr(), {{"dp", -1}, {"tp", tp_size}});
    torch::manual_seed(5);
    models::GPT plain(config());
    torch::manual_seed(5);
    models::TPGPT parallel(config(), mesh.comm("tp"));
    const auto reference = named(*plain);
    const auto mine = named(*parallel);
    EXPECT_EQ(mine.size(), reference.size()) << "the same parameter names as GPT";
    for (const auto& [name, value] : mine) {
      auto it = reference.find(name);
      if (it == reference.end()) {
        ADD_FAILURE() << "GPT has no parameter " << name;
        continue;
      }
      EXPECT_TRUE(torch::equal(value, slice_of(name, it->second, mesh.rank("tp"), tp_size)))
          << name << " at tp " << tp_size;
    }
  }
}

enum class Engine { DDP, FSDP };

// Saves what this mesh holds and checks it against the single-process
// model's own checkpoint (rank 0), then loads it back onto the mesh.
void check_checkpoint(const std::string& where, const DeviceMesh& mesh, const dtrain::HeldModel& held,
                      torch::optim::Optimizer& optimizer, models::GPT& plain, torch::optim::Optimizer& reference_optimizer,
                      double tolerance) {
  const std::string folder = dtrain::testing::shared_temp_folder("tp-checkpoint");
  dtrain::save_checkpoint(folder + "/mesh", held, &optimizer, kSteps, mesh.world());
  if (world().rank() == 0) {
    dtrain::save_checkpoint(folder + "/single", *plain, &reference_optimizer, kSteps);
    const auto mine = dtrain::load_full_checkpoint(folder + "/mesh", /*optimizer_state=*/true);
    const auto reference = dtrain::load_full_checkpoint(folder + "/single", /*optimizer_state=*/true);
    EXPECT_EQ(mine.size(), reference.size()) << where << ": the same tensors as the single-process checkpoint";
    double worst = 0;
    std::string worst_name;
    for (const auto& [name, value] : reference) {
      auto it = mine.find(name);
      if (it == mine.end() || !it->second.sizes().equals(value.sizes())) {
        ADD_FAILURE() << where << ": the checkpoint lacks " << name << " or has another shape";
        continue;
      }
      if (!value.is_floating_point()) {
        EXPECT_TRUE(torch::equal(it->second, value)) << where << ": " << name;
        continue;
      }
      const double difference = (it->second - value).abs().max().item<double>();
      if (difference > worst) {
        worst = difference;
        worst_name = name;
      }
    }
    EXPECT_LE(worst, tolerance) << where << ": checkpoint's largest difference in " << worst_name;
    std::printf("%s: checkpoint within %.3g of the single-process one (%zu tensors)\n", where.c_str(), worst, mine.size());
  }
  // Back onto the same mesh: every piece as it was.
  std::vector<torch::Tensor> saved;
  for (const auto& tensor : held.tensors) {
    saved.push_back(tensor.flat.clone());
    tensor.flat.zero_();
  }
  dtrain::load_checkpoint(folder + "/mesh", held, &optimizer, mesh.world());
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_TRUE(torch::equal(held.tensors[i].flat, saved[i])) << where << ": " << held.tensors[i].name << " reloaded";
  }
  world().blocking().barrier();
  if (world().rank() == 0) std::filesystem::remove_all(folder);
}

// Trains the plain GPT on one process and the TP GPT on the mesh; compares.
void train_and_compare(int tp_size, Engine engine, bool sgd, bool sequence_parallel = false) {
  DeviceMesh mesh(world_ptr(), {{"dp", -1}, {"tp", tp_size}});
  const std::string where = mesh.describe() + (engine == Engine::DDP ? " DDP" : " FSDP") + (sgd ? " SGD" : " AdamW") +
                            (sequence_parallel ? " sequence-parallel" : "");
  torch::manual_seed(17);
  models::GPT plain(config());
  auto reference_optimizer = make_optimizer(sgd, plain->parameters());

  torch::manual_seed(17);
  models::TPGPT parallel{nullptr};
  std::unique_ptr<dtrain::DistributedDataParallel<models::TPGPT>> ddp;
  std::unique_ptr<dtrain::FullyShardedDataParallel<models::TPGPT>> fsdp;
  if (engine == Engine::DDP) {
    parallel = models::TPGPT(config(), mesh.comm("tp"), sequence_parallel);
    ddp = std::make_unique<dtrain::DistributedDataParallel<models::TPGPT>>(parallel, mesh.comm("dp"));
  } else {
    {
      dtrain::DeferredConstruction deferred;  // each unit materialised straight into its dp shards
      parallel = models::TPGPT(config(), mesh.comm("tp"), sequence_parallel);
    }
    fsdp = std::make_unique<dtrain::FullyShardedDataParallel<models::TPGPT>>(
        dtrain::fully_shard(parallel, mesh.comm("dp")));
  }
  auto optimizer = make_optimizer(sgd, parallel->parameters());
  const int64_t part = kGlobalBatch / mesh.size("dp");

  for (int step = 0; step < kSteps; ++step) {
    const Batch b = batch(step);
    reference_optimizer->zero_grad();
    torch::Tensor reference_loss = torch::nn::functional::cross_entropy(
        plain->forward(b.inputs).reshape({-1, config().vocab_size}), b.targets.reshape({-1}));
    reference_loss.backward();
    reference_optimizer->step();

    optimizer->zero_grad();
    const torch::Tensor inputs = b.inputs.narrow(0, mesh.rank("dp") * part, part);
    const torch::Tensor targets = b.targets.narrow(0, mesh.rank("dp") * part, part);
    const torch::Tensor logits = engine == Engine::DDP ? (*ddp)(inputs) : (*fsdp)(inputs);
    EXPECT_EQ(logits.size(-1), config().vocab_size / tp_size) << "each rank holds its slice of the logits only";
    torch::Tensor loss = parallel->loss(logits, targets).mean();
    loss.backward();
    optimizer->step();

    torch::Tensor global = loss.detach().to(torch::kDouble).reshape({1});
    mesh.comm("dp")->blocking().all_reduce(global, dtrain::ReduceOp::Avg);
    EXPECT_NEAR(global.item<double>(), reference_loss.item<double>(), 1e-5) << where << ", step " << step;
  }

  const std::map<std::string, torch::Tensor> mine =
      engine == Engine::DDP ? named(*parallel) : fsdp->full_state_dict(/*rank0_only=*/false);
  const auto reference = named(*plain);
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, value] : reference) {
    auto it = mine.find(name);
    if (it == mine.end()) {
      ADD_FAILURE() << where << ": no parameter " << name;
      continue;
    }
    const double difference =
        (it->second - slice_of(name, value, mesh.rank("tp"), tp_size)).abs().max().item<double>();
    if (difference > worst) {
      worst = difference;
      worst_name = name;
    }
  }
  EXPECT_LE(worst, sgd ? 1e-6 : 1e-4) << where << ": largest difference in " << worst_name;
  if (world().rank() == 0) std::printf("%s: parameters within %.3g of single-process training\n", where.c_str(), worst);

  torch::NoGradGuard no_grad;
  check_checkpoint(where, mesh, engine == Engine::DDP ? dtrain::held_on_mesh(*parallel, mesh) : dtrain::held_on_mesh(*fsdp, mesh),
                   *optimizer, plain, *reference_optimizer, sgd ? 1e-6 : 1e-4);
}

TEST(TPGPT, EveryMeshAndEngineEqualsSingleProcessTraining) {
  for (int tp_size = 1; tp_size <= world().size(); ++tp_size) {
    if (world().size() % tp_size != 0) continue;
    for (Engine engine : {Engine::DDP, Engine::FSDP})
      for (bool sgd : {false, true}) train_and_compare(tp_size, engine, sgd);
  }
}

// Sequence parallelism: the same results (seq_len 8 splits for tp 1, 2, 4;
// at tp 3 the model takes the plain path, which is checked too).
TEST(TPGPT, SequenceParallelEqualsSingleProcessTraining) {
  for (int tp_size = 1; tp_size <= world().size(); ++tp_size) {
    if (world().size() % tp_size != 0) continue;
    for (Engine engine : {Engine::DDP, Engine::FSDP}) train_and_compare(tp_size, engine, /*sgd=*/true, true);
    train_and_compare(tp_size, Engine::FSDP, /*sgd=*/false, true);
  }
}

// Dropout does not depend on tp (issue 20, item 3): with dropout 0.2 in the
// attention weights, after the projections and on the embeddings, the whole
// world as one tp group (dp = 1, every rank seeded alike before each step)
// trains as one process does, with and without sequence parallelism: the
// masks are drawn for the whole tensors and each rank applies its part
// (dtrain/attention.h). Drawing each rank's own mask instead fails this at
// tp >= 2 by far more than the tolerance.
TEST(TPGPT, DropoutDoesNotDependOnTp) {
  const int tp_size = world().size();
  DeviceMesh mesh(world_ptr(), {{"dp", 1}, {"tp", tp_size}});
  models::GPTConfig c = config();
  c.dropout = 0.2;
  for (bool sequence_parallel : {false, true}) {
    torch::manual_seed(23);
    models::GPT plain(c);
    torch::manual_seed(23);
    models::TPGPT parallel(c, mesh.comm("tp"), sequence_parallel);
    torch::optim::SGD reference_optimizer(plain->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::optim::SGD optimizer(parallel->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    const std::string where = mesh.describe() + (sequence_parallel ? " sequence-parallel" : "") + " dropout 0.2";
    for (int step = 0; step < 4; ++step) {
      const Batch b = batch(step);
      torch::manual_seed(300 + step);
      reference_optimizer.zero_grad();
      torch::Tensor reference_loss = torch::nn::functional::cross_entropy(
          plain->forward(b.inputs).reshape({-1, c.vocab_size}), b.targets.reshape({-1}));
      reference_loss.backward();
      reference_optimizer.step();

      torch::manual_seed(300 + step);
      optimizer.zero_grad();
      torch::Tensor loss = parallel->loss(parallel->forward(b.inputs), b.targets).mean();
      loss.backward();
      optimizer.step();
      EXPECT_NEAR(loss.item<double>(), reference_loss.item<double>(), 1e-5) << where << ", step " << step;
    }
    const auto reference = named(*plain);
    double worst = 0;
    for (const auto& [name, value] : named(*parallel)) {
      worst = std::max(worst, (value - slice_of(name, reference.at(name), mesh.rank("tp"), tp_size)).abs().max().item<double>());
    }
    EXPECT_LE(worst, 1e-6) << where;
    if (world().rank() == 0) std::printf("%s: parameters within %.3g of single-process training\n", where.c_str(), worst);
  }
}

TEST(TPGPT, HeadsOrVocabularyThatDoNotSplitAreRejectedWithTheNumbers) {
  models::GPTConfig c = config();
  c.n_head = 6;
  c.n_embd = 24;
  try {
    models::check_tensor_parallel(c, 4);
    ADD_FAILURE() << "tp 4 with 6 heads";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("tp 4 does not divide the 6 attention heads"), std::string::npos)
        << error.what();
  }
  c = config();
  c.vocab_size = 26;
  EXPECT_THROW(models::check_tensor_parallel(c, 4), std::invalid_argument);
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
