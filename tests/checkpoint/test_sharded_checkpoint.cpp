// Sharded checkpoints (include/dtrain/checkpoint.h, src/checkpoint/), run at
// several world sizes by CTest:
// - Reshard.Save / Reshard.Load: a checkpoint saved by {ddp, zero2, fsdp} at
//   1, 2 or 4 ranks after kStepsBefore AdamW steps loads into {ddp, fsdp} at
//   1 or 3 ranks; kStepsAfter more steps end within 1e-5 of an uninterrupted
//   single-process run (CTest fixtures run the saves first; the directory
//   comes from DTRAIN_CHECKPOINT_TEST_DIR).
// - Resume: at the same world size and strategy (ddp, zero1, zero2, fsdp,
//   hybrid), resumed training gives bitwise the losses of uninterrupted
//   training (AdamW and SGD momentum).
// - Damage: a flipped byte in a rank file, a truncated or missing manifest,
//   another model or optimizer: refused with a clear error, nothing changed.
// - Export: `dtrain checkpoint export` writes the model's full parameters.
#include <dtrain/checkpoint.h>
#include <dtrain/ddp.h>
#include <dtrain/fsdp.h>

#include "checkpoint/held_state.h"
#include "checkpoint/manifest.h"

#include "../common/multirank_gtest.h"
#include "../ddp/ddp_test_support.h"
#include "../fsdp/fsdp_test_models.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using dtrain::testing::world;
using dtrain::testing::world_ptr;

constexpr int kStepsBefore = 3;
constexpr int kStepsAfter = 3;
constexpr int64_t kGlobalBatch = 12;

using Sequential = torch::nn::Sequential;

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, const std::vector<torch::Tensor>& params) {
  if (kind == "sgd") return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.01).weight_decay(0.01));
}

// One model trained by one strategy on this rank ("single": the whole
// global batch on every rank, no communication).
struct Trainee {
  Trainee(const std::string& strategy, const std::string& optimizer_kind, uint64_t seed) : strategy(strategy) {
    torch::manual_seed(seed);
    model = fsdp_test::make_mlp();
    if (strategy == "ddp") {
      ddp = std::make_unique<dtrain::DistributedDataParallel<Sequential>>(model, world_ptr());
    } else if (strategy != "single") {
      dtrain::FSDPOptions options;
      options.strategy = dtrain::sharding_from_string(strategy);
      const int w = world().size();
      options.hybrid_group_size = (w % 2 == 0 && w > 2) ? 2 : w;  // real groups of 2 at 4 ranks
      fsdp = std::make_unique<dtrain::FullyShardedDataParallel<Sequential>>(model, world_ptr(), options);
    }
    optimizer = make_optimizer(optimizer_kind, model->parameters());
  }

  // One step on global batch `step`; returns this rank's loss.
  double train_step(int64_t step) {
    const auto global = ddp_test::global_batch(step, kGlobalBatch);
    const auto batch = strategy == "single" ? global : ddp_test::local_part(global, world());
    optimizer->zero_grad();
    torch::Tensor out = ddp ? (*ddp)(batch.inputs) : fsdp ? (*fsdp)(batch.inputs) : model->forward(batch.inputs);
    torch::Tensor loss = torch::cross_entropy_loss(out, batch.targets);
    loss.backward();
    optimizer->step();
    return loss.item<double>();
  }

  void save(const std::string& dir, int64_t step) {
    if (fsdp) {
      dtrain::save_checkpoint(dir, *fsdp, optimizer.get(), step, {{"test", "yes"}});
    } else {
      dtrain::save_checkpoint(dir, *model, optimizer.get(), step, strategy == "single" ? nullptr : world_ptr());
    }
  }

  dtrain::CheckpointManifest load(const std::string& dir) {
    if (fsdp) return dtrain::load_checkpoint(dir, *fsdp, optimizer.get());
    return dtrain::load_checkpoint(dir, *model, optimizer.get(), strategy == "single" ? nullptr : world_ptr());
  }

  std::map<std::string, torch::Tensor> full_parameters() {
    if (fsdp) return fsdp->full_state_dict(/*rank0_only=*/false);
    std::map<std::string, torch::Tensor> result;
    for (const auto& item : model->named_parameters()) result[item.key()] = item.value().detach().clone();
    return result;
  }

  std::string strategy;
  Sequential model{nullptr};
  std::unique_ptr<dtrain::DistributedDataParallel<Sequential>> ddp;
  std::unique_ptr<dtrain::FullyShardedDataParallel<Sequential>> fsdp;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

// Rank 0 picks a fresh directory name and tells the others.
std::string shared_temp_dir(const std::string& what) {
  auto stamp = torch::tensor({static_cast<int64_t>(::getpid())}, torch::kInt64);
  world().broadcast(stamp, 0)->wait();
  return (fs::temp_directory_path() /
          ("dtrain-ckpt-" + what + "-" + std::to_string(stamp.item<int64_t>()) + "-np" + std::to_string(world().size())))
      .string();
}

void barrier() { world().barrier()->wait(); }

void remove_on_rank0(const std::string& dir) {
  barrier();
  if (world().rank() == 0) fs::remove_all(dir);
}

double max_difference(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b,
                      std::string& worst_name) {
  double worst = a.size() == b.size() ? 0 : 1e30;
  for (const auto& [name, value] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.sizes() != value.sizes()) return 1e30;
    if (value.numel() == 0) continue;  // an empty piece of a shard
    const double d = (value - it->second).abs().max().item<double>();
    if (d > worst) {
      worst = d;
      worst_name = name;
    }
  }
  return worst;
}

std::string reshard_root() {
  const char* dir = std::getenv("DTRAIN_CHECKPOINT_TEST_DIR");
  return dir ? dir : "";
}

const std::vector<std::string> kSavedBy = {"ddp", "zero2", "fsdp"};
const std::vector<int> kSavedAt = {1, 2, 4};

// ---------------------------------------------------------------- reshard

TEST(Reshard, Save) {
  const std::string root = reshard_root();
  if (root.empty()) GTEST_SKIP() << "DTRAIN_CHECKPOINT_TEST_DIR not set";
  for (const auto& strategy : kSavedBy) {
    Trainee trainee(strategy, "adamw", 7);
    for (int step = 0; step < kStepsBefore; ++step) trainee.train_step(step);
    const std::string dir = root + "/" + strategy + "-np" + std::to_string(world().size());
    EXPECT_NO_THROW(trainee.save(dir, kStepsBefore)) << dir;
  }
}

TEST(Reshard, Load) {
  const std::string root = reshard_root();
  if (root.empty()) GTEST_SKIP() << "DTRAIN_CHECKPOINT_TEST_DIR not set";
  Trainee reference("single", "adamw", 7);
  for (int step = 0; step < kStepsBefore + kStepsAfter; ++step) reference.train_step(step);
  const auto expected = reference.full_parameters();

  for (const auto& saved_by : kSavedBy) {
    for (int saved_at : kSavedAt) {
      const std::string dir = root + "/" + saved_by + "-np" + std::to_string(saved_at);
      for (const std::string strategy : {"ddp", "fsdp"}) {
        SCOPED_TRACE(saved_by + " at " + std::to_string(saved_at) + " ranks -> " + strategy + " at " +
                     std::to_string(world().size()));
        Trainee trainee(strategy, "adamw", 99);  // other initial weights: all must come from the file
        dtrain::CheckpointManifest manifest;
        EXPECT_NO_THROW(manifest = trainee.load(dir));
        EXPECT_EQ(manifest.step, kStepsBefore);
        EXPECT_EQ(manifest.world_size, saved_at);
        for (int step = kStepsBefore; step < kStepsBefore + kStepsAfter; ++step) trainee.train_step(step);
        std::string worst_name;
        EXPECT_LE(max_difference(trainee.full_parameters(), expected, worst_name), 1e-5) << worst_name;
      }
    }
  }

  // Control: the same continuation without the optimizer state misses by far.
  Trainee without_state("fsdp", "adamw", 99);
  EXPECT_NO_THROW(dtrain::load_checkpoint(root + "/fsdp-np2", *without_state.fsdp, nullptr));
  for (int step = kStepsBefore; step < kStepsBefore + kStepsAfter; ++step) without_state.train_step(step);
  std::string worst_name;
  EXPECT_GT(max_difference(without_state.full_parameters(), expected, worst_name), 1e-4);
}

// ------------------------------------------------------ bitwise resumption

class Resume : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(Resume, LossesBitwiseEqual) {
  const auto [strategy, optimizer] = GetParam();
  const std::string dir = shared_temp_dir("resume-" + strategy + "-" + optimizer);
  std::vector<double> uninterrupted, resumed;
  {
    Trainee trainee(strategy, optimizer, 5);
    for (int step = 0; step < kStepsBefore; ++step) trainee.train_step(step);
    trainee.save(dir, kStepsBefore);
    for (int step = kStepsBefore; step < kStepsBefore + kStepsAfter; ++step) uninterrupted.push_back(trainee.train_step(step));
  }
  {
    Trainee trainee(strategy, optimizer, 77);
    EXPECT_NO_THROW(trainee.load(dir));
    for (int step = kStepsBefore; step < kStepsBefore + kStepsAfter; ++step) resumed.push_back(trainee.train_step(step));
  }
  for (size_t i = 0; i < uninterrupted.size(); ++i) {
    EXPECT_EQ(resumed[i], uninterrupted[i]) << "step " << kStepsBefore + i;  // exact
  }
  remove_on_rank0(dir);
}

INSTANTIATE_TEST_SUITE_P(Strategies, Resume,
                         ::testing::Combine(::testing::Values("ddp", "zero1", "zero2", "fsdp", "hybrid"),
                                            ::testing::Values("adamw", "sgd")),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

// ------------------------------------------------------------------ damage

std::string error_of_load(Trainee& trainee, const std::string& dir) {
  try {
    trainee.load(dir);
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";
}

// Damages `path` in place: XORs the byte `from_end` bytes before its end with `mask`.
void flip_byte(const std::string& path, int from_end, char mask) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(-from_end, std::ios::end);
  char byte = 0;
  file.read(&byte, 1);
  byte ^= mask;
  file.seekp(-from_end, std::ios::end);
  file.write(&byte, 1);
}

TEST(Damage, FlippedByteNamesTheFile) {
  const std::string dir = shared_temp_dir("flip");
  Trainee trainee("fsdp", "adamw", 5);
  trainee.train_step(0);
  trainee.save(dir, 1);
  const auto before = trainee.full_parameters();
  const int victim = world().size() - 1;
  char name[64];
  std::snprintf(name, sizeof(name), "rank-%05d-of-%05d.safetensors", victim, world().size());
  barrier();
  if (world().rank() == 0) flip_byte(dir + "/" + name, 3, 0x10);
  barrier();
  const std::string error = error_of_load(trainee, dir);
  EXPECT_NE(error.find(name), std::string::npos) << error;
  EXPECT_NE(error.find("checksum"), std::string::npos) << error;
  std::string worst;
  EXPECT_EQ(max_difference(trainee.full_parameters(), before, worst), 0.0) << "a failed load changed " << worst;
  remove_on_rank0(dir);
}

TEST(Damage, TruncatedOrMissingManifestIsNoCheckpoint) {
  const std::string dir = shared_temp_dir("manifest");
  Trainee trainee("ddp", "adamw", 5);
  trainee.train_step(0);
  trainee.save(dir, 1);
  barrier();
  if (world().rank() == 0) fs::resize_file(dir + "/manifest.json", fs::file_size(dir + "/manifest.json") / 2);
  barrier();
  std::string error = error_of_load(trainee, dir);
  EXPECT_NE(error.find("not a complete checkpoint manifest"), std::string::npos) << error;
  barrier();
  if (world().rank() == 0) fs::remove(dir + "/manifest.json");
  barrier();
  error = error_of_load(trainee, dir);
  EXPECT_NE(error.find("no manifest.json"), std::string::npos) << error;
  remove_on_rank0(dir);
}

TEST(Damage, SaveReplacesAnExistingCheckpoint) {
  const std::string dir = shared_temp_dir("replace");
  Trainee trainee("fsdp", "adamw", 5);
  trainee.train_step(0);
  trainee.save(dir, 1);
  trainee.train_step(1);
  trainee.save(dir + "/", 2);  // the same directory
  dtrain::CheckpointManifest manifest;
  EXPECT_NO_THROW(manifest = trainee.load(dir));
  EXPECT_EQ(manifest.step, 2);
  barrier();
  if (world().rank() == 0) {
    for (const auto& entry : fs::directory_iterator(fs::path(dir).parent_path())) {
      const auto name = entry.path().filename().string();
      EXPECT_FALSE(name.rfind(fs::path(dir).filename().string() + ".", 0) == 0) << "left behind: " << name;
    }
  }
  remove_on_rank0(dir);
}

// A save whose pieces do not describe the tensors (here every rank holds
// only elements [0, 6) of a 10-element tensor: [6, 10) is in no file) fails
// at save time, through the parser every load uses, naming the manifest and
// the tensor (rank 0; the others learn that it failed), and leaves no
// checkpoint behind: before, such a save succeeded and only loads refused it.
TEST(Damage, SaveRefusesAManifestItsPiecesDoNotCover) {
  const std::string dir = shared_temp_dir("uncovered");
  dtrain::HeldModel held;
  held.strategy = world().size() == 1 ? "single" : "ddp";
  held.rank = world().rank();
  held.world_size = world().size();
  const auto values = torch::arange(10, torch::kFloat32);
  dtrain::HeldTensor piece;
  piece.name = "w";
  piece.shape = {10};
  piece.begin = 0;
  piece.end = 6;
  piece.flat = values.narrow(0, 0, 6);
  piece.replicas = world().size();
  piece.replica = world().rank();
  held.tensors.push_back(piece);
  std::string error;
  try {
    dtrain::save_checkpoint(dir, held, nullptr, 1, world_ptr());
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Rank 0 writes the manifest and says why; the others learn that it failed.
  EXPECT_FALSE(error.empty()) << "the save succeeded";
  if (world().rank() == 0) {
    EXPECT_NE(error.find("the manifest this save was about to write"), std::string::npos) << error;
    EXPECT_NE(error.find("'w'"), std::string::npos) << error;
  }
  barrier();
  EXPECT_FALSE(fs::exists(dir)) << dir;
  remove_on_rank0(dir);
}

TEST(Damage, MismatchedModelOrOptimizerIsRefused) {
  const std::string dir = shared_temp_dir("mismatch");
  Trainee trainee("fsdp", "adamw", 5);
  trainee.train_step(0);
  trainee.save(dir, 1);

  Trainee sgd("fsdp", "sgd", 6);
  const auto before = sgd.full_parameters();
  std::string error = error_of_load(sgd, dir);
  EXPECT_NE(error.find("adamw optimizer state but the optimizer is sgd"), std::string::npos) << error;
  std::string worst;
  EXPECT_EQ(max_difference(sgd.full_parameters(), before, worst), 0.0) << "a refused load changed " << worst;

  torch::manual_seed(5);
  Sequential other(torch::nn::Flatten(), torch::nn::Linear(fsdp_test::kImage * fsdp_test::kImage, 30));
  error = "";
  try {
    dtrain::load_checkpoint(dir, *other, nullptr, world_ptr());
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("does not match the model"), std::string::npos) << error;
  EXPECT_NE(error.find("'1.weight' is [33, 64] in the checkpoint but [30, 64] in the model"), std::string::npos) << error;
  EXPECT_NE(error.find("the model lacks '3.weight'"), std::string::npos) << error;
  remove_on_rank0(dir);
}

// Issue 16, items 1 and 2: crafted bad checkpoints (among them AdamW state
// with some fields but not all, which used to fail half-way through the
// writes), each refused with an error naming the problem, and the live model's parameters and optimizer
// state bitwise unchanged after each failed load.
std::map<std::string, torch::Tensor> optimizer_snapshot(Trainee& trainee) {
  std::map<std::string, torch::Tensor> snapshot;
  int index = 0;
  for (const auto& parameter : trainee.optimizer->param_groups()[0].params()) {
    for (const auto& [key, value] : dtrain::detail::optimizer_state_of(*trainee.optimizer, parameter)) {
      snapshot[std::to_string(index) + "/" + key] = value.clone();
    }
    ++index;
  }
  return snapshot;
}

TEST(Damage, CraftedCheckpointsChangeNothing) {
  const std::string base = shared_temp_dir("crafted");
  Trainee saver("fsdp", "adamw", 5);
  saver.train_step(0);
  saver.save(base, 1);
  const std::string first_file = "rank-00000-of-" + [] {
    char text[8];
    std::snprintf(text, sizeof(text), "%05d", world().size());
    return std::string(text);
  }() + ".safetensors";

  using Manifest = dtrain::CheckpointManifest;
  auto erase_tensor = [](Manifest& m, const std::string& name) {
    m.tensors.erase(name);
    for (auto& file : m.files) std::erase_if(file.pieces, [&](const auto& piece) { return piece.name == name; });
  };
  // `name` and its AdamW state, as a checkpoint of another model has them.
  auto with_state = [](const std::string& name) {
    return std::vector<std::string>{name, "optim/" + name + "/exp_avg", "optim/" + name + "/exp_avg_sq"};
  };
  auto pieces_of = [](Manifest& m, const std::string& name) {
    std::vector<Manifest::Piece*> found;
    for (auto& file : m.files) {
      for (auto& piece : file.pieces) {
        if (piece.name == name && piece.end > piece.begin) found.push_back(&piece);
      }
    }
    return found;
  };
  // Rewrites the rank files to hold exactly the (edited) manifest's pieces in
  // its dtypes, with fresh sizes and checksums: a checkpoint that is
  // consistent in itself and wrong only for the model, so that the checks
  // against the model are reached, not the ones of the files' integrity.
  auto make_files_agree = [](const std::string& dir, Manifest& m) {
    for (auto& file : m.files) {
      const std::string path = (fs::path(dir) / file.name).string();
      const auto saved = dtrain::load_safetensors(path);
      std::vector<std::pair<std::string, torch::Tensor>> tensors;
      for (const auto& piece : file.pieces) {
        const auto dtype = m.tensors.at(piece.name).dtype == "float64" ? torch::kFloat64 : torch::kFloat32;
        const torch::Tensor* old = saved.find(piece.name);
        tensors.emplace_back(piece.name, old ? old->to(old->scalar_type() == torch::kInt64 ? torch::kInt64 : dtype)
                                             : torch::zeros({piece.end - piece.begin}, dtype));
      }
      dtrain::save_safetensors(path, tensors);
      file.bytes = dtrain::detail::file_bytes(path);
      file.xxh64 = dtrain::detail::file_xxh64(path);
    }
  };
  struct Case {
    std::string name;
    std::function<void(Manifest&)> edit_manifest;
    std::function<void(const std::string& dir)> edit_files;
    std::string expected;
    bool files_agree = false;  // make_files_agree after the manifest's edit
  };
  const std::vector<Case> cases = {
      {"overlap", [&](Manifest& m) { auto p = *pieces_of(m, "1.weight").front(); p.begin += 1; m.files.back().pieces.push_back(p); },
       nullptr, "of '1.weight' are in more than one piece"},
      {"duplicate piece", [&](Manifest& m) { m.files.front().pieces.push_back(*pieces_of(m, "3.weight").front()); },
       nullptr, "of '3.weight' are in more than one piece"},
      {"gap", [&](Manifest& m) { auto p = pieces_of(m, "1.bias").front(); p->end = p->begin; }, nullptr,
       "of '1.bias' are in no piece"},
      {"piece beyond the tensor", [&](Manifest& m) {
         auto pieces = pieces_of(m, "5.bias");
         (*std::max_element(pieces.begin(), pieces.end(), [](auto* a, auto* b) { return a->end < b->end; }))->end += 5;
       }, nullptr, "'5.bias'"},
      {"unknown tensor in a file", [&](Manifest& m) { m.files.front().pieces.push_back({"ghost", 0, 1}); }, nullptr,
       "holds unknown tensor 'ghost'"},
      {"wrong dtype", [&](Manifest& m) { for (const auto& n : with_state("1.weight")) m.tensors.at(n).dtype = "float64"; }, nullptr,
       "'1.weight' is float64 in the checkpoint but float32 in the model", true},
      {"wrong shape", [&](Manifest& m) { for (const auto& n : with_state("1.weight")) m.tensors.at(n).shape = {64, 33}; }, nullptr,
       "'1.weight' is [64, 33] in the checkpoint but [33, 64] in the model", true},
      {"tensor the model lacks", [](Manifest& m) { m.tensors["9.weight"] = {"float32", {0, 4}}; }, nullptr,
       "the model lacks '9.weight'", true},
      {"tensor the checkpoint lacks", [&](Manifest& m) {
         for (const auto& n : with_state("5.bias")) erase_tensor(m, n);
         erase_tensor(m, "optim/5.bias/step");
       }, nullptr,
       "the checkpoint lacks '5.bias'", true},
      {"missing exp_avg", [&](Manifest& m) { erase_tensor(m, "optim/3.weight/exp_avg"); }, nullptr,
       "the adamw state of '3.weight' lacks exp_avg", true},
      // The manifest edited alone: it no longer describes the rank files.
      {"manifest dtype not the file's", [&](Manifest& m) { for (const auto& n : with_state("1.weight")) m.tensors.at(n).dtype = "float64"; }, nullptr,
       "'1.weight' is stored as F32 but the manifest says float64"},
      {"file holds a tensor the manifest omits", [&](Manifest& m) { erase_tensor(m, "optim/3.weight/exp_avg"); },
       nullptr, "holds 'optim/3.weight/exp_avg', which the manifest does not list"},
      {"piece not the file's size", [&](Manifest& m) {
         // One more column: the manifest's last pieces grow, the file's entries do not.
         for (const auto& n : with_state("3.weight")) {
           auto& shape = m.tensors.at(n).shape;
           auto pieces = pieces_of(m, n);
           (*std::max_element(pieces.begin(), pieces.end(), [](auto* a, auto* b) { return a->end < b->end; }))->end += shape[0];
           shape[1] += 1;
         }
       }, nullptr, "elements but the manifest's piece"},
      {"file named for another rank", [](Manifest& m) { m.files.front().name = "rank-00000-of-00009.safetensors"; },
       nullptr, "is named 'rank-00000-of-00009.safetensors', not"},
      {"optimizer state under an unknown key", [](Manifest& m) {
         m.tensors["optim/1.weight/velocity"] = m.tensors.at("1.weight");
       }, nullptr, "'optim/1.weight/velocity' is no adamw state"},
      {"unknown strategy", [](Manifest& m) { m.strategy = "zero9"; }, nullptr, "unknown strategy 'zero9'"},
      {"truncated rank file", nullptr,
       [&](const std::string& dir) { fs::resize_file(fs::path(dir) / first_file, fs::file_size(fs::path(dir) / first_file) - 100); },
       first_file},
      {"flipped byte", nullptr,
       [&](const std::string& dir) { flip_byte((fs::path(dir) / first_file).string(), 5, 0x40); }, "checksum"},
  };

  Trainee live("fsdp", "adamw", 6);
  live.train_step(0);  // it has optimizer state to lose
  const auto parameters = live.full_parameters();
  const auto state = optimizer_snapshot(live);
  ASSERT_FALSE(state.empty());
  for (const auto& c : cases) {
    const std::string dir = base + "-" + std::to_string(&c - cases.data());
    if (world().rank() == 0) {
      fs::copy(base, dir, fs::copy_options::recursive);
      if (c.edit_manifest) {
        auto manifest = dtrain::read_checkpoint_manifest(dir);
        c.edit_manifest(manifest);
        if (c.files_agree) make_files_agree(dir, manifest);
        std::ofstream(fs::path(dir) / "manifest.json", std::ios::trunc) << dtrain::detail::manifest_to_json(manifest);
      }
      if (c.edit_files) c.edit_files(dir);
    }
    barrier();
    const std::string error = error_of_load(live, dir);
    EXPECT_NE(error.find(c.expected), std::string::npos) << c.name << ": " << (error.empty() ? "loaded" : error);
    std::string worst;
    EXPECT_EQ(max_difference(live.full_parameters(), parameters, worst), 0.0) << c.name << " changed " << worst;
    EXPECT_EQ(max_difference(optimizer_snapshot(live), state, worst), 0.0) << c.name << " changed optimizer state "
                                                                             << worst;
    remove_on_rank0(dir);
  }
  remove_on_rank0(base);
}

// ------------------------------------------------------------------ export

TEST(Export, FullParametersThroughTheCli) {
  const std::string dir = shared_temp_dir("export");
  Trainee trainee("fsdp", "adamw", 5);
  for (int step = 0; step < 2; ++step) trainee.train_step(step);
  trainee.save(dir, 2);
  const auto full = trainee.full_parameters();
  barrier();
  if (world().rank() == 0) {
    const std::string out = dir + "-export.safetensors";
    const std::string cli = DTRAIN_CLI;
    EXPECT_EQ(std::system((cli + " checkpoint inspect " + dir + " > " + dir + "-inspect.txt").c_str()), 0);
    std::ifstream inspect(dir + "-inspect.txt");
    const std::string text((std::istreambuf_iterator<char>(inspect)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("step        2"), std::string::npos) << text;
    EXPECT_NE(text.find("strategy    fsdp"), std::string::npos) << text;  // the --strategy name (issue 17)
    EXPECT_NE(text.find("optim/1.weight/exp_avg"), std::string::npos) << text;
    EXPECT_EQ(std::system((cli + " checkpoint export " + dir + " --to " + out + " > /dev/null").c_str()), 0);
    const auto file = dtrain::load_safetensors(out);
    EXPECT_EQ(file.tensors.size(), full.size());
    for (const auto& [name, value] : full) {
      const auto* saved = file.find(name);
      if (!saved) {
        ADD_FAILURE() << "export lacks " << name;
        continue;
      }
      EXPECT_TRUE(torch::equal(*saved, value)) << name;
    }
    fs::remove(out);
    fs::remove(dir + "-inspect.txt");
  }
  remove_on_rank0(dir);
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
