// Pipeline parallelism (include/dtrain/pipeline.h, dtrain/gpt_stage.h): the
// world as one pipeline of GPT stages, under GPipe and 1F1B with 1-4
// microbatches, trains as one process trains the whole GPT on the same
// batch: the stages hold GPT's weights bitwise, every step's loss within
// 1e-5, the parameters within the FSDP equivalence tolerances at the end
// (1e-6 under SGD with momentum, 1e-4 under AdamW). 1F1B keeps at most
// stages - stage microbatches in flight, GPipe all of them.
#include <dtrain/checkpoint.h>
#include <dtrain/ddp.h>
#include <dtrain/deferred_init.h>
#include <dtrain/gpt_stage.h>
#include <dtrain/memory.h>
#include <dtrain/mesh.h>
#include <dtrain/pipeline.h>

#include "../common/multirank_gtest.h"

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

namespace {

using dtrain::testing::world;
using dtrain::testing::world_ptr;
namespace models = dtrain::models;
namespace pp = dtrain::pp;

constexpr int64_t kGlobalBatch = 12;

models::GPTConfig config() {
  models::GPTConfig c;
  c.vocab_size = 24;
  c.seq_len = 8;
  c.n_layer = 4;  // a block for each of up to 4 stages
  c.n_embd = 32;
  c.n_head = 4;
  return c;
}

std::map<std::string, torch::Tensor> named(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : module.named_parameters()) out[item.key()] = item.value().detach();
  return out;
}

models::GPTStage my_stage() {
  const auto blocks = pp::divide_blocks(config().n_layer, world().size());
  const auto mine = blocks[static_cast<size_t>(world().rank())];
  return models::GPTStage(config(), world().rank(), world().size(), mine.first, mine.last);
}

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<torch::Tensor>& parameters, bool sgd) {
  if (sgd) return std::make_unique<torch::optim::SGD>(parameters, torch::optim::SGDOptions(0.05).momentum(0.9));
  return std::make_unique<torch::optim::AdamW>(parameters, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
}

// `batch` random windows of the config's length and their next tokens.
std::pair<torch::Tensor, torch::Tensor> token_batch(int64_t batch, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto tokens = torch::randint(0, config().vocab_size, {batch, config().seq_len + 1}, generator);
  return {tokens.narrow(1, 0, config().seq_len), tokens.narrow(1, 1, config().seq_len)};
}

// One step of the whole GPT on one process; returns its loss.
double reference_step(models::GPT& plain, torch::optim::Optimizer& optimizer, const torch::Tensor& inputs,
                      const torch::Tensor& targets) {
  optimizer.zero_grad();
  auto loss = cross_entropy(plain->forward(inputs), targets);
  loss.backward();
  optimizer.step();
  return loss.item<double>();
}

// The parameters `held` (a stage, or a rank's chunks) equal the whole
// GPT's of the same name, within the FSDP equivalence tolerances.
void expect_the_whole_models_parameters(const models::GPT& plain,
                                        const std::vector<std::shared_ptr<torch::nn::Module>>& held, bool sgd,
                                        const std::string& where) {
  const auto reference = named(*plain);
  double worst = 0;
  std::string worst_name;
  for (const auto& module : held)
    for (const auto& [name, value] : named(*module)) {
      const double difference = (value - reference.at(name)).abs().max().item<double>();
      if (difference > worst) {
        worst = difference;
        worst_name = name;
      }
    }
  EXPECT_LE(worst, sgd ? 1e-6 : 1e-4) << where << ": largest difference in " << worst_name;
  if (world().rank() == 0) std::printf("%s: parameters within %.3g of single-process training\n", where.c_str(), worst);
}

TEST(Pipeline, BlocksAreDividedEvenlyOrAsSplit) {
  auto blocks = pp::divide_blocks(7, 3);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].first, 0);
  EXPECT_EQ(blocks[0].last, 3);
  EXPECT_EQ(blocks[1].last, 5);
  EXPECT_EQ(blocks[2].last, 7);
  blocks = pp::divide_blocks(7, 2, {2, 5});
  EXPECT_EQ(blocks[1].first, 2);
  EXPECT_THROW(pp::divide_blocks(2, 3), std::invalid_argument);
  EXPECT_THROW(pp::divide_blocks(7, 2, {3, 3}), std::invalid_argument);
  EXPECT_THROW(pp::divide_blocks(7, 2, {7, 0}), std::invalid_argument);
  EXPECT_THROW(pp::schedule_from("zb-v"), std::invalid_argument);
  EXPECT_EQ(pp::schedule_from("interleaved"), pp::Schedule::Interleaved);
}

TEST(Pipeline, StagesHoldTheGPTsWeights) {
  torch::manual_seed(5);
  models::GPT plain(config());
  torch::manual_seed(5);
  models::GPTStage stage = my_stage();
  const auto reference = named(*plain);
  for (const auto& [name, value] : named(*stage)) {
    auto it = reference.find(name);
    if (it == reference.end()) {
      ADD_FAILURE() << "GPT has no parameter " << name;
      continue;
    }
    EXPECT_TRUE(torch::equal(value, it->second)) << name;
  }
}

void train_and_compare(pp::Schedule schedule, int microbatches, bool sgd) {
  const std::string where = pp::schedule_name(schedule) + " on " + std::to_string(world().size()) + " stages, " +
                            std::to_string(microbatches) + " microbatches, " + (sgd ? "SGD" : "AdamW");
  torch::manual_seed(17);
  models::GPT plain(config());
  torch::manual_seed(17);
  models::GPTStage stage = my_stage();
  auto reference_optimizer = make_optimizer(plain->parameters(), sgd);
  auto optimizer = make_optimizer(stage->parameters(), sgd);
  pp::Pipeline pipeline(world_ptr(), schedule, microbatches);

  for (int step = 0; step < 4; ++step) {
    const auto [inputs, targets] = token_batch(kGlobalBatch, 700 + step);
    const double reference_loss = reference_step(plain, *reference_optimizer, inputs, targets);

    optimizer->zero_grad();
    const double loss = pipeline.step([&](const torch::Tensor& x) { return stage->forward(x); }, cross_entropy, inputs,
                                      targets, {kGlobalBatch / microbatches, config().seq_len, config().n_embd});
    pp::sum_tied_gradients(stage->tied_weight(), pipeline);
    optimizer->step();
    EXPECT_NEAR(loss, reference_loss, 1e-5) << where << ", step " << step;

    const int expected = schedule == pp::Schedule::GPipe ? microbatches
                                                         : std::min(world().size() - world().rank(), microbatches);
    EXPECT_EQ(pipeline.max_in_flight(), expected) << where << ": microbatches in flight on stage " << world().rank();
  }
  expect_the_whole_models_parameters(plain, {stage.ptr()}, sgd, where);
}

// Evaluation through the stages (forwards only, no gradients) sums what one
// process computes on the whole GPT in eval mode.
TEST(Pipeline, EvaluationEqualsTheWholeModels) {
  torch::manual_seed(41);
  models::GPT plain(config());
  torch::manual_seed(41);
  models::GPTStage stage = my_stage();
  plain->eval();
  stage->eval();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
  auto tokens = torch::randint(0, config().vocab_size, {kGlobalBatch, config().seq_len + 1}, generator);
  const auto inputs = tokens.narrow(1, 0, config().seq_len), targets = tokens.narrow(1, 1, config().seq_len);
  torch::NoGradGuard no_grad;
  const double expected = cross_entropy(plain->forward(inputs), targets).item<double>() * kGlobalBatch;
  pp::Pipeline pipeline(world_ptr(), pp::Schedule::OneFOneB, 4);
  const double got = pipeline.evaluate(
      [&](const torch::Tensor& x) { return stage->forward(x); },
      [&](const torch::Tensor& logits, const torch::Tensor& t) { return cross_entropy(logits, t) * t.size(0); }, inputs,
      targets, {kGlobalBatch / 4, config().seq_len, config().n_embd});
  EXPECT_NEAR(got, expected, 1e-4) << "summed over " << kGlobalBatch << " windows";
  EXPECT_FALSE(stage->parameters().front().grad().defined()) << "evaluation leaves no gradients";
}

TEST(Pipeline, EveryScheduleEqualsSingleProcessTraining) {
  for (auto schedule : {pp::Schedule::GPipe, pp::Schedule::OneFOneB})
    for (int microbatches : {1, 2, 4}) train_and_compare(schedule, microbatches, /*sgd=*/true);
  train_and_compare(pp::Schedule::OneFOneB, 3, /*sgd=*/false);
}

// The stages' checkpoint (dtrain::held_on_pipeline, over the world) is the
// whole model's: read back whole on one process it equals the checkpoint of
// the single-process run (parameters and momentum within 1e-6; GPT's tied
// wte written once although two stages hold it), it loads into the plain
// GPT (pp = 1), and back onto the stages bitwise.
TEST(Pipeline, TheStagesCheckpointIsTheWholeModels) {
  dtrain::DeviceMesh mesh(world_ptr(), {{"dp", 1}, {"pp", world().size()}});
  torch::manual_seed(29);
  models::GPT plain(config());
  torch::manual_seed(29);
  models::GPTStage stage = my_stage();
  torch::optim::SGD reference_optimizer(plain->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD optimizer(stage->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  pp::Pipeline pipeline(world_ptr(), pp::Schedule::OneFOneB, 2);
  for (int step = 0; step < 2; ++step) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(60 + step);
    auto tokens = torch::randint(0, config().vocab_size, {kGlobalBatch, config().seq_len + 1}, generator);
    const auto inputs = tokens.narrow(1, 0, config().seq_len), targets = tokens.narrow(1, 1, config().seq_len);
    reference_optimizer.zero_grad();
    cross_entropy(plain->forward(inputs), targets).backward();
    reference_optimizer.step();
    optimizer.zero_grad();
    pipeline.step([&](const torch::Tensor& x) { return stage->forward(x); }, cross_entropy, inputs, targets,
                  {kGlobalBatch / 2, config().seq_len, config().n_embd});
    pp::sum_tied_gradients(stage->tied_weight(), pipeline);
    optimizer.step();
  }
  std::shared_ptr<torch::nn::Module> whole;
  {
    dtrain::DeferredConstruction deferred;  // names, shapes and dtypes only
    whole = models::GPT(config()).ptr();
  }
  const std::filesystem::path folder = dtrain::testing::shared_temp_folder("pp-checkpoint");
  torch::NoGradGuard no_grad;
  const dtrain::HeldModel held = dtrain::held_on_pipeline(*stage, *whole, mesh);
  dtrain::save_checkpoint((folder / "stages").string(), held, &optimizer, 2, mesh.world());
  if (world().rank() == 0) {
    dtrain::save_checkpoint((folder / "single").string(), *plain, &reference_optimizer, 2);
    const auto mine = dtrain::load_full_checkpoint((folder / "stages").string(), true);
    const auto reference = dtrain::load_full_checkpoint((folder / "single").string(), true);
    EXPECT_EQ(mine.size(), reference.size());
    for (const auto& [name, value] : reference) {
      auto it = mine.find(name);
      ASSERT_NE(it, mine.end()) << name;
      EXPECT_LE((it->second.to(torch::kDouble) - value.to(torch::kDouble)).abs().max().item<double>(), 1e-6) << name;
    }
    // Into the whole model on one process (pp = 1).
    torch::manual_seed(99);
    models::GPT fresh(config());
    torch::optim::SGD fresh_optimizer(fresh->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    dtrain::load_checkpoint((folder / "stages").string(), *fresh, &fresh_optimizer);
    for (const auto& [name, value] : named(*fresh)) EXPECT_TRUE(torch::equal(value, mine.at(name))) << name;
  }
  std::vector<torch::Tensor> saved;
  for (const auto& tensor : held.tensors) {
    saved.push_back(tensor.flat.clone());
    tensor.flat.zero_();
  }
  dtrain::load_checkpoint((folder / "stages").string(), held, &optimizer, mesh.world());
  for (size_t i = 0; i < saved.size(); ++i) EXPECT_TRUE(torch::equal(held.tensors[i].flat, saved[i])) << held.tensors[i].name;
  world().barrier()->wait();
  if (world().rank() == 0) std::filesystem::remove_all(folder);
}

// (dp, pp) = (2, 2) on 4 ranks: DDP over dp around each stage, reducing only
// at the step's last backward (pp::BackwardRunner and DDP's no_sync), equals
// single-process training on the global batch. At other world sizes the
// meshes with dp > 1 and pp > 1 that fit (none below 4 ranks).
TEST(Pipeline, DDPOverTheDataParallelDimensionEqualsSingleProcessTraining) {
  for (int stages = 2; stages <= world().size() / 2; ++stages) {
    if (world().size() % stages != 0 || stages > config().n_layer) continue;
    dtrain::DeviceMesh mesh(world_ptr(), {{"dp", -1}, {"pp", stages}});
    const int dp = mesh.size("dp");
    for (auto schedule : {pp::Schedule::GPipe, pp::Schedule::OneFOneB}) {
      const std::string where = pp::schedule_name(schedule) + " on " + mesh.describe();
      torch::manual_seed(17);
      models::GPT plain(config());
      torch::manual_seed(17);
      const auto blocks = pp::divide_blocks(config().n_layer, stages)[static_cast<size_t>(mesh.rank("pp"))];
      models::GPTStage stage(config(), mesh.rank("pp"), stages, blocks.first, blocks.last);
      dtrain::DistributedDataParallel<models::GPTStage> ddp(stage, mesh.comm("dp"));
      torch::optim::SGD reference_optimizer(plain->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      torch::optim::SGD optimizer(stage->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      constexpr int kMicrobatches = 3;
      pp::Pipeline pipeline(mesh.comm("pp"), schedule, kMicrobatches);
      const int64_t part = kGlobalBatch / dp;
      for (int step = 0; step < 3; ++step) {
        auto generator = at::make_generator<at::CPUGeneratorImpl>(900 + step);
        auto tokens = torch::randint(0, config().vocab_size, {kGlobalBatch, config().seq_len + 1}, generator);
        const auto inputs = tokens.narrow(1, 0, config().seq_len), targets = tokens.narrow(1, 1, config().seq_len);
        reference_optimizer.zero_grad();
        auto reference_loss = cross_entropy(plain->forward(inputs), targets);
        reference_loss.backward();
        reference_optimizer.step();

        optimizer.zero_grad();
        const int64_t first = mesh.rank("dp") * part;
        double loss = pipeline.step(
            [&](const torch::Tensor& x) { return ddp(x); }, cross_entropy, inputs.narrow(0, first, part),
            targets.narrow(0, first, part), {part / kMicrobatches, config().seq_len, config().n_embd}, torch::kFloat32,
            [&](bool sync, const std::function<void()>& backward) {
              if (sync) return backward();
              auto guard = ddp.no_sync();
              backward();
            });
        pp::sum_tied_gradients(stage->tied_weight(), pipeline);
        optimizer.step();
        auto mean = torch::tensor({loss}, torch::kFloat64);
        mesh.comm("dp")->blocking().all_reduce(mean, dtrain::ReduceOp::Avg);
        EXPECT_NEAR(mean.item<double>(), reference_loss.item<double>(), 1e-5) << where << ", step " << step;
      }
      const auto reference = named(*plain);
      double worst = 0;
      for (const auto& [name, value] : named(*stage)) worst = std::max(worst, (value - reference.at(name)).abs().max().item<double>());
      EXPECT_LE(worst, 1e-6) << where;
      if (world().rank() == 0) std::printf("%s, DDP over dp: parameters within %.3g of single-process training\n", where.c_str(), worst);
    }
  }
}

// What the tracking allocator sees on the first stage: 1F1B with 8
// microbatches holds at most `stages` microbatches' activations, as GPipe
// does with `stages` microbatches (the same growth of the stage's peak over
// its memory before the step, within 10%), while GPipe with 8 holds all 8
// (more than 1.5x as much here). Microbatches of one size throughout.
TEST(Pipeline, OneFOneBHoldsAtMostStagesMicrobatchesOnTheFirstStage) {
  if (world().size() < 2) GTEST_SKIP() << "a pipeline of one stage holds one microbatch either way";
  dtrain::memory::install_tracking_allocator();
  constexpr int64_t kMicro = 4;
  auto growth = [&](pp::Schedule schedule, int microbatches) {
    torch::manual_seed(3);
    models::GPTStage stage = my_stage();
    pp::Pipeline pipeline(world_ptr(), schedule, microbatches);
    auto generator = at::make_generator<at::CPUGeneratorImpl>(11);
    auto tokens = torch::randint(0, config().vocab_size, {kMicro * microbatches, config().seq_len + 1}, generator);
    const auto inputs = tokens.narrow(1, 0, config().seq_len), targets = tokens.narrow(1, 1, config().seq_len);
    auto run = [&] {
      pipeline.step([&](const torch::Tensor& x) { return stage->forward(x); }, cross_entropy, inputs, targets,
                    {kMicro, config().seq_len, config().n_embd});
    };
    run();  // the gradients exist from here on; the next step measures activations
    world().barrier()->wait();
    const int64_t before = dtrain::memory::live_bytes();
    dtrain::memory::reset_peak();
    run();
    return static_cast<double>(dtrain::memory::peak_bytes() - before);
  };
  const int stages = world().size();
  const double gpipe_stages = growth(pp::Schedule::GPipe, stages);
  const double gpipe = growth(pp::Schedule::GPipe, 8);
  const double one_f_one_b = growth(pp::Schedule::OneFOneB, 8);
  if (world().rank() == 0) {
    std::printf("first stage of %d, growth of the peak in a step: gpipe with %d microbatches %.0f bytes; with 8: gpipe "
                "%.0f, 1f1b %.0f\n", stages, stages, gpipe_stages, gpipe, one_f_one_b);
    EXPECT_LE(one_f_one_b, 1.1 * gpipe_stages) << "1F1B holds at most " << stages << " microbatches on the first stage";
    EXPECT_GE(gpipe, 1.5 * one_f_one_b) << "GPipe holds all 8";
  }
}

// ---- interleaved 1F1B

// Each rank's schedule run against the data dependencies (a chunk's forward
// needs the previous stage's, its backward the next stage's and its own
// forward), every forward costing 1/v and backward 2/v of a stage's time and
// messages nothing: whether every rank gets through its order (no cycle of
// waits), and the idle share of the step (makespan against M x 3 of work).
struct Simulated {
  bool completes = false;
  double bubble = 0;
};
Simulated simulate(pp::Schedule schedule, int P, int v, int M) {
  std::vector<std::vector<pp::Action>> orders;
  for (int s = 0; s < P; ++s) orders.push_back(pp::schedule_actions(schedule, s, P, v, M));
  std::map<std::tuple<bool, int, int>, double> done;  // (forward, model stage, microbatch) -> finish time
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  std::vector<double> clock(static_cast<size_t>(P), 0.0);
  const int stages = P * v;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s) {
      auto& i = next[static_cast<size_t>(s)];
      while (i < orders[static_cast<size_t>(s)].size()) {
        const pp::Action a = orders[static_cast<size_t>(s)][i];
        const int stage = a.chunk * P + s;
        std::vector<std::tuple<bool, int, int>> needs;
        if (a.forward && stage > 0) needs.emplace_back(true, stage - 1, a.microbatch);
        if (!a.forward) {
          needs.emplace_back(true, stage, a.microbatch);
          if (stage < stages - 1) needs.emplace_back(false, stage + 1, a.microbatch);
        }
        double start = clock[static_cast<size_t>(s)];
        bool ready = true;
        for (const auto& need : needs) {
          auto it = done.find(need);
          if (it == done.end()) ready = false;
          else start = std::max(start, it->second);
        }
        if (!ready) break;
        clock[static_cast<size_t>(s)] = start + (a.forward ? 1.0 : 2.0) / v;
        done[{a.forward, stage, a.microbatch}] = clock[static_cast<size_t>(s)];
        ++i;
        progress = true;
      }
    }
  }
  Simulated result;
  result.completes = true;
  for (int s = 0; s < P; ++s) result.completes &= next[static_cast<size_t>(s)] == orders[static_cast<size_t>(s)].size();
  const double makespan = *std::max_element(clock.begin(), clock.end());
  result.bubble = (makespan - 3.0 * M) / makespan;
  return result;
}

TEST(Pipeline, InterleavedScheduleRunsEveryChunkOnceWithoutACycleOfWaits) {
  for (int P : {2, 3, 4})
    for (int v : {2, 3})
      for (int M : {P, 2 * P, 4 * P}) {
        const std::string where = std::to_string(P) + " stages, " + std::to_string(v) + " chunks, " +
                                  std::to_string(M) + " microbatches";
        for (int s = 0; s < P; ++s) {
          std::map<std::tuple<bool, int, int>, int> seen;
          for (const auto& a : pp::schedule_actions(pp::Schedule::Interleaved, s, P, v, M)) {
            if (!a.forward) {
              EXPECT_EQ(seen.count({true, a.chunk, a.microbatch}), 1u) << where << ": backward before forward";
            }
            ++seen[{a.forward, a.chunk, a.microbatch}];
          }
          EXPECT_EQ(seen.size(), static_cast<size_t>(2 * v * M)) << where << ", rank " << s;
          for (const auto& [action, count] : seen) EXPECT_EQ(count, 1) << where;
        }
        const Simulated interleaved = simulate(pp::Schedule::Interleaved, P, v, M);
        const Simulated one_f_one_b = simulate(pp::Schedule::OneFOneB, P, 1, M);
        ASSERT_TRUE(interleaved.completes) << where << ": a cycle of waits";
        EXPECT_NEAR(interleaved.bubble, (P - 1.0) / (v * M + P - 1.0), 1e-9) << where;
        EXPECT_NEAR(one_f_one_b.bubble, (P - 1.0) / (M + P - 1.0), 1e-9) << where;
      }
  EXPECT_THROW(pp::schedule_actions(pp::Schedule::Interleaved, 0, 2, 2, 3), std::invalid_argument);  // M % P
  EXPECT_THROW(pp::schedule_actions(pp::Schedule::Interleaved, 0, 2, 1, 4), std::invalid_argument);  // one chunk
  EXPECT_THROW(pp::schedule_actions(pp::Schedule::Interleaved, 0, 1, 2, 4), std::invalid_argument);  // one stage
  EXPECT_THROW(pp::schedule_actions(pp::Schedule::OneFOneB, 0, 2, 2, 4), std::invalid_argument);     // chunks need it
}

// The model as P x v stages, this rank holding stages rank, rank + P, ...:
// each chunk built after the same seed, as the whole GPT is.
models::GPTConfig chunked_config(int chunks) {
  models::GPTConfig c = config();
  c.n_layer = static_cast<int64_t>(world().size()) * chunks;
  return c;
}
std::vector<models::GPTStage> my_chunks(int chunks, uint64_t seed) {
  const int P = world().size(), stages = P * chunks;
  const auto blocks = pp::divide_blocks(chunked_config(chunks).n_layer, stages);
  std::vector<models::GPTStage> out;
  for (int k = 0; k < chunks; ++k) {
    const int stage = world().rank() + k * P;
    torch::manual_seed(seed);
    out.emplace_back(chunked_config(chunks), stage, stages, blocks[static_cast<size_t>(stage)].first,
                     blocks[static_cast<size_t>(stage)].last);
  }
  return out;
}

void train_interleaved_and_compare(int chunks, int microbatches, bool sgd) {
  const int P = world().size();
  const std::string where = "interleaved on " + std::to_string(P) + " ranks x " + std::to_string(chunks) +
                            " chunks, " + std::to_string(microbatches) + " microbatches, " + (sgd ? "SGD" : "AdamW");
  torch::manual_seed(23);
  models::GPT plain(chunked_config(chunks));
  auto stages = my_chunks(chunks, 23);
  std::vector<torch::Tensor> mine;
  torch::Tensor tied;  // the first rank's chunk 0 and the last rank's last chunk hold wte
  for (auto& chunk : stages) {
    for (const auto& p : chunk->parameters()) mine.push_back(p);
    if (chunk->tied_weight().defined()) tied = chunk->tied_weight();
  }
  auto reference_optimizer = make_optimizer(plain->parameters(), sgd);
  auto optimizer = make_optimizer(mine, sgd);
  pp::Pipeline pipeline(world_ptr(), pp::Schedule::Interleaved, microbatches, chunks);
  const auto forward = [&](int k, const torch::Tensor& x) { return stages.at(static_cast<size_t>(k))->forward(x); };
  const int64_t batch = 4 * microbatches;

  for (int step = 0; step < 3; ++step) {
    const auto [inputs, targets] = token_batch(batch, 900 + step);
    const double reference_loss = reference_step(plain, *reference_optimizer, inputs, targets);

    optimizer->zero_grad();
    const double loss = pipeline.step(forward, cross_entropy, inputs, targets,
                                      {batch / microbatches, config().seq_len, config().n_embd});
    pp::sum_tied_gradients(tied, pipeline);
    optimizer->step();
    EXPECT_NEAR(loss, reference_loss, 1e-5) << where << ", step " << step;
    // The warmup's forwards and the one of the first backward's turn, or every forward.
    const int s = world().rank();
    const int expected = std::min(microbatches * chunks, 2 * (P - s - 1) + (chunks - 1) * P + 1);
    EXPECT_EQ(pipeline.max_in_flight(), expected) << where << ": chunk-microbatches in flight on rank " << s;
  }
  std::vector<std::shared_ptr<torch::nn::Module>> held;
  for (auto& chunk : stages) held.push_back(chunk.ptr());
  expect_the_whole_models_parameters(plain, held, sgd, where);

  // Evaluation and inference through every chunk equal the whole model's.
  plain->eval();
  for (auto& chunk : stages) chunk->eval();
  torch::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
  auto tokens = torch::randint(0, config().vocab_size, {batch, config().seq_len + 1}, generator);
  const auto inputs = tokens.narrow(1, 0, config().seq_len), targets = tokens.narrow(1, 1, config().seq_len);
  const auto logits = plain->forward(inputs);
  const double expected = cross_entropy(logits, targets).item<double>() * static_cast<double>(batch);
  const double got = pipeline.evaluate(
      forward, [&](const torch::Tensor& l, const torch::Tensor& t) { return cross_entropy(l, t) * t.size(0); }, inputs,
      targets, {batch / microbatches, config().seq_len, config().n_embd});
  EXPECT_NEAR(got, expected, 1e-4) << where << ": evaluation";
  const auto inferred = pipeline.infer(forward, inputs, {batch, config().seq_len, config().n_embd},
                                       {batch, config().seq_len, config().vocab_size});
  EXPECT_LE((inferred - logits).abs().max().item<double>(), 1e-5) << where << ": inference";
}

TEST(Pipeline, InterleavedOneFOneBEqualsSingleProcessTraining) {
  if (world().size() < 2) GTEST_SKIP() << "interleaving needs at least 2 pipeline ranks";
  const int P = world().size();
  train_interleaved_and_compare(2, P, /*sgd=*/true);
  train_interleaved_and_compare(2, 2 * P, /*sgd=*/true);
  train_interleaved_and_compare(3, P, /*sgd=*/false);
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
