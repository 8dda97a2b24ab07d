// dtrain plan for Llama (issue 39, item 6): describe_llama and
// describe_llama_stage against the tracking allocator on the same runs, as
// test_plan.cpp checks the GPT's. Whole models under every engine, fp32
// and bf16, with grouped-query attention and a tied head; tensor-parallel
// slices on every (dp, tp) mesh of the world, kv heads split and whole, with
// and without sequence parallelism; pipeline stages on every (dp, pp, tp)
// mesh, both schedules; context parallelism (ring attention) on every
// (dp, cp, tp) mesh. Each run's units are the ones FSDP builds, and its
// measured step peak is within 5% of the plan's.
#include <dtrain/context_parallel.h>
#include <dtrain/ddp.h>
#include <dtrain/deferred_init.h>
#include <dtrain/fsdp.h>
#include <dtrain/llama.h>
#include <dtrain/memory.h>
#include <dtrain/mesh.h>
#include <dtrain/pipeline.h>
#include <dtrain/plan.h>
#include <dtrain/tp_llama.h>

#include "../common/multirank_gtest.h"
#include "plan_test_support.h"

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

using dtrain::testing::world;
using dtrain::testing::expect_planned_peak;
using dtrain::testing::world_ptr;
namespace plan = dtrain::plan;
namespace pp = dtrain::pp;

// 8 query heads over 2 kv heads: tp 2 splits the kv heads, tp 4 holds them
// whole (Note [replicated key/value heads]). The MLP's default width 384
// splits over 4.
dtrain::models::LlamaConfig measured_llama(bool tied) {
  dtrain::models::LlamaConfig config;
  config.n_layer = 4;
  config.dim = 128;
  config.n_head = 8;
  config.n_kv_head = 2;
  config.seq_len = 32;
  config.tie_embeddings = tied;
  return config;
}

// One engine over `module` on `group`, called as dtrain train calls it.
struct Engine {
  std::unique_ptr<dtrain::DistributedDataParallelBase> ddp;
  std::unique_ptr<dtrain::FullyShardedBase> fsdp;
  std::vector<torch::Tensor> parameters;

  Engine(const std::shared_ptr<torch::nn::Module>& module, dtrain::CommPtr group, const std::string& strategy,
         const dtrain::FSDPOptions& options) {
    if (strategy == "ddp") {
      ddp = std::make_unique<dtrain::DistributedDataParallelBase>(module, group, dtrain::DDPOptions{});
      parameters = ddp->parameters();
    } else {
      fsdp = std::make_unique<dtrain::FullyShardedBase>(module, group, options);
      parameters = fsdp->parameters();
    }
  }
  torch::Tensor forward(const std::function<torch::Tensor(const torch::Tensor&)>& module_forward,
                        const torch::Tensor& x) {
    return dtrain::testing::engine_forward(ddp.get(), fsdp.get(), module_forward, x);
  }
};

// Llama (tp_group null) or this rank's TPLlama slice, of `part` (the whole
// model by default), built deferred under the sharded strategies as dtrain
// train builds it; its forward and the loss dtrain train takes of it.
struct BuiltLlama {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> loss;
};

BuiltLlama build_llama(const dtrain::models::LlamaConfig& config, const std::string& strategy,
                       const dtrain::CommPtr& tp_group, bool sequence_parallel = false,
                       dtrain::models::LlamaPart part = {}) {
  std::optional<dtrain::DeferredConstruction> deferred;
  if (strategy != "ddp") deferred.emplace();
  if (!tp_group) {
    auto llama = dtrain::models::Llama(config, part);
    return {llama.ptr(), [llama](const torch::Tensor& x) mutable { return llama->forward(x); },
            [](const torch::Tensor& logits, const torch::Tensor& t) {
              return torch::nn::functional::cross_entropy(logits.flatten(0, -2), t.flatten());
            }};
  }
  auto llama = dtrain::models::TPLlama(config, tp_group, sequence_parallel, part);
  return {llama.ptr(), [llama](const torch::Tensor& x) mutable { return llama->forward(x); },
          [llama](const torch::Tensor& logits, const torch::Tensor& t) { return llama->loss(logits, t).mean(); }};
}

void expect_units(const Engine& engine, const plan::ModelSpec& spec, const std::string& where) {
  if (!engine.fsdp || world().rank() != 0) return;
  const auto units = engine.fsdp->units();
  ASSERT_EQ(units.size(), spec.units.size()) << where;
  for (size_t u = 0; u < units.size(); ++u) {
    EXPECT_EQ(units[u].name, spec.units[u].name) << where;
    EXPECT_EQ(units[u].numel, spec.units[u].numel()) << where << " unit '" << units[u].name << "'";
    std::vector<std::string> names;
    for (const auto& p : spec.units[u].parameters) names.push_back(p.name);
    EXPECT_EQ(names, units[u].parameters) << where << " unit '" << units[u].name << "'";
  }
}

struct PlannedRun {
  std::string strategy;
  bool bf16 = false;
  bool checkpointing = false;
  std::string name() const {
    return strategy + (bf16 ? " bf16" : "") + (checkpointing ? " with activation checkpointing" : "");
  }
};

plan::PlanOptions options_of(const PlannedRun& run, int world_size, int rank) {
  plan::PlanOptions options;
  plan::set_strategy(options, run.strategy);
  options.world_size = world_size;
  options.rank = rank;
  options.fsdp.activation_checkpointing = run.checkpointing;
  if (run.bf16) options.fsdp.mixed_precision.param_dtype = torch::kBFloat16;
  return options;
}

// The step's peak over steps 2 and 3 (the first allocates the optimizer's state).
int64_t measured_step_peak(int64_t before, torch::optim::Optimizer& optimizer, const std::function<void()>& step) {
  int64_t measured = 0;
  for (int s = 0; s < 3; ++s) {
    dtrain::memory::reset_peak();
    {
      optimizer.zero_grad();
      step();
      optimizer.step();
    }
    if (s > 0) measured = std::max(measured, dtrain::memory::peak_bytes() - before);
  }
  return measured;
}

// The whole model on the world's ranks, at 2 and 8 windows per rank.
TEST(MeasuredLlama, WholeModelPeakMatchesThePlan) {
  dtrain::memory::install_tracking_allocator();
  const std::vector<PlannedRun> runs{{"ddp"}, {"zero2"}, {"fsdp"}, {"fsdp", true}, {"fsdp", false, true}};
  for (const bool tied : {false, true}) {
    const auto config = measured_llama(tied);
    for (const int64_t batch : {int64_t{2}, int64_t{8}}) {
      for (const auto& run : runs) {
        const auto compute = run.bf16 ? torch::kBFloat16 : torch::kFloat32;
        const auto spec = plan::describe_llama(config, batch, compute);
        const auto options = options_of(run, world().size(), world().rank());
        world().barrier()->wait();
        const int64_t before = dtrain::memory::live_bytes();
        int64_t measured = 0;
        const std::string where = run.name() + (tied ? ", tied" : "") + ", batch " + std::to_string(batch);
        {
          torch::manual_seed(0);
          dtrain::models::Llama model{nullptr};
          {
            std::optional<dtrain::DeferredConstruction> deferred;
            if (run.strategy != "ddp") deferred.emplace();
            model = dtrain::models::Llama(config);
          }
          Engine engine(model.ptr(), world_ptr(), run.strategy, options.fsdp);
          expect_units(engine, spec, where);
          torch::optim::AdamW optimizer(engine.parameters, torch::optim::AdamWOptions(1e-4).weight_decay(0.01));
          torch::manual_seed(1 + world().rank());
          auto tokens = torch::randint(0, config.vocab_size, {batch, config.seq_len}, torch::kLong);
          auto targets = torch::randint(0, config.vocab_size, {batch, config.seq_len}, torch::kLong);
          measured = measured_step_peak(before, optimizer, [&] {
            auto logits = engine.forward([&](const torch::Tensor& x) { return model->forward(x); }, tokens);
            torch::nn::functional::cross_entropy(logits.flatten(0, -2), targets.flatten()).backward();
          });
        }
        expect_planned_peak(measured, plan::make_plan(spec, options), where + " on " + std::to_string(world().size()));
      }
    }
  }
}

// One tensor-parallel slice per rank on every (dp, tp) mesh of the world with
// tp > 1, DDP or FSDP over dp: kv heads split (tp 2) or whole (tp 4).
TEST(MeasuredLlama, TensorParallelPeakMatchesThePlan) {
  dtrain::memory::install_tracking_allocator();
  const auto config = measured_llama(false);
  constexpr int64_t kBatch = 4;  // per dp rank
  for (int tp = 2; tp <= world().size(); tp *= 2) {
    if (world().size() % tp != 0) continue;
    const dtrain::DeviceMesh mesh(world_ptr(), {{"dp", -1}, {"tp", tp}});
    for (const bool sequence_parallel : {false, true}) {
      const auto spec = plan::describe_llama(config, kBatch, torch::kFloat32, tp, sequence_parallel);
      for (const PlannedRun& run : {PlannedRun{"ddp"}, PlannedRun{"fsdp"}}) {
        const auto options = options_of(run, mesh.size("dp"), mesh.rank("dp"));
        world().barrier()->wait();
        const int64_t before = dtrain::memory::live_bytes();
        int64_t measured = 0;
        const std::string where =
            run.name() + " on " + mesh.describe() + (sequence_parallel ? " sequence-parallel" : "");
        {
          torch::manual_seed(0);
          dtrain::models::TPLlama model{nullptr};
          {
            std::optional<dtrain::DeferredConstruction> deferred;
            if (run.strategy != "ddp") deferred.emplace();
            model = dtrain::models::TPLlama(config, mesh.comm("tp"), sequence_parallel);
          }
          Engine engine(model.ptr(), mesh.comm("dp"), run.strategy, options.fsdp);
          expect_units(engine, spec, where);
          torch::optim::AdamW optimizer(engine.parameters, torch::optim::AdamWOptions(1e-4).weight_decay(0.01));
          torch::manual_seed(1 + mesh.rank("dp"));
          auto tokens = torch::randint(0, config.vocab_size, {kBatch, config.seq_len}, torch::kLong);
          auto targets = torch::randint(0, config.vocab_size, {kBatch, config.seq_len}, torch::kLong);
          measured = measured_step_peak(before, optimizer, [&] {
            auto logits = engine.forward([&](const torch::Tensor& x) { return model->forward(x); }, tokens);
            model->loss(logits, targets).mean().backward();
          });
        }
        expect_planned_peak(measured, plan::make_plan(spec, options), where);
      }
    }
  }
}

// Ring attention (Note [ring attention plan]): each rank holds 1/cp of every
// sequence, on every (dp, cp, tp) mesh of the world with cp > 1, the engine
// over dp x cp as dtrain train --cp runs it; fp32 and bf16.
TEST(MeasuredLlama, ContextParallelPeakMatchesThePlan) {
  if (world().size() < 2) GTEST_SKIP() << "a ring needs two ranks";
  dtrain::memory::install_tracking_allocator();
  auto config = measured_llama(false);
  config.seq_len = 64;
  constexpr int64_t kBatch = 4;  // per dp group
  for (int cp = 2; cp <= world().size(); cp *= 2) {
    for (const int tp : {1, 2}) {
      if (world().size() % (cp * tp) != 0) continue;
      std::vector<std::pair<std::string, int>> dimensions{{"dp", -1}, {"cp", cp}};
      if (tp > 1) dimensions.emplace_back("tp", tp);
      dtrain::DeviceMesh mesh(world_ptr(), dimensions);
      const dtrain::CommPtr engine_group = mesh.flatten({"dp", "cp"}, "dp_cp");
      const dtrain::cp::ContextParallel context(mesh.comm("cp"));
      for (const PlannedRun& run : {PlannedRun{"ddp"}, PlannedRun{"fsdp"}, PlannedRun{"fsdp", true}}) {
        const auto compute = run.bf16 ? torch::kBFloat16 : torch::kFloat32;
        const auto spec = plan::describe_llama(config, kBatch, compute, tp, false, cp);
        const auto options = options_of(run, engine_group->size(), engine_group->rank());
        world().barrier()->wait();
        const int64_t before = dtrain::memory::live_bytes();
        int64_t measured = 0;
        const std::string where = run.name() + " on " + mesh.describe();
        {
          torch::manual_seed(0);
          const BuiltLlama built = build_llama(config, run.strategy, tp > 1 ? mesh.comm("tp") : nullptr);
          const auto& [module, model_forward, loss] = built;
          Engine engine(module, engine_group, run.strategy, options.fsdp);
          expect_units(engine, spec, where);
          torch::optim::AdamW optimizer(engine.parameters, torch::optim::AdamWOptions(1e-4).weight_decay(0.01));
          torch::manual_seed(1 + mesh.rank("dp"));
          auto tokens = torch::randint(0, config.vocab_size, {kBatch, config.seq_len}, torch::kLong);
          auto targets = torch::randint(0, config.vocab_size, {kBatch, config.seq_len}, torch::kLong);
          const auto my_tokens = context.shard(tokens, 1), my_targets = context.shard(targets, 1);
          measured = measured_step_peak(before, optimizer, [&] {
            const dtrain::cp::ContextParallel::Scope in_scope(context);
            loss(engine.forward(model_forward, my_tokens), my_targets).backward();
          });
        }
        expect_planned_peak(measured, plan::make_plan(spec, options), where);
      }
    }
  }
}

// One stage's measured step peak, run as dtrain train --pp runs it (the
// tied head's gradients summed over the end stages): on `mesh`'s pp and tp
// dimensions, the engine over `engine_group`, under `context`'s ring when
// there is one (--cp: the stage holds T / cp tokens of each sequence).
struct StageRun {
  dtrain::models::LlamaConfig config;
  int microbatches = 4;
  int64_t part = 8;  // windows per dp group
  pp::Schedule schedule = pp::Schedule::OneFOneB;
  bool sequence_parallel = false;
  const dtrain::cp::ContextParallel* context = nullptr;
};

int64_t measured_stage_peak(const StageRun& s, const dtrain::DeviceMesh& mesh, const dtrain::CommPtr& engine_group,
                            const PlannedRun& run, const plan::PlanOptions& options, const plan::ModelSpec& spec,
                            const std::string& where) {
  const auto& config = s.config;
  const bool tied = config.tie_embeddings;
  const int stages = mesh.size("pp"), stage = mesh.rank("pp");
  const int tp = mesh.has("tp") ? mesh.size("tp") : 1;
  const auto blocks = pp::divide_blocks(config.n_layer, stages)[static_cast<size_t>(stage)];
  const dtrain::models::LlamaPart part{stage, stages, blocks.first, blocks.last};
  world().barrier()->wait();
  const int64_t before = dtrain::memory::live_bytes();
  torch::manual_seed(0);
  const BuiltLlama built =
      build_llama(config, run.strategy, tp > 1 ? mesh.comm("tp") : nullptr, s.sequence_parallel, part);
  const auto& [module, stage_forward, loss] = built;
  Engine engine(module, engine_group, run.strategy, options.fsdp);
  expect_units(engine, spec, where);
  torch::Tensor tied_weight;
  if (tied && (stage == 0 || stage == stages - 1)) {
    if (engine.fsdp) {
      for (const auto& shard : engine.fsdp->parameter_shards())
        if (shard.name == "embed_tokens.weight") tied_weight = shard.parameter;
    } else {
      for (const auto& item : module->named_parameters())
        if (item.key() == "embed_tokens.weight") tied_weight = item.value();
    }
  }
  torch::optim::AdamW optimizer(engine.parameters, torch::optim::AdamWOptions(1e-4).weight_decay(0.01));
  pp::Pipeline pipeline(mesh.comm("pp"), s.schedule, s.microbatches);
  torch::manual_seed(1 + mesh.rank("dp"));
  auto tokens = torch::randint(0, config.vocab_size, {s.part, config.seq_len}, torch::kLong);
  auto targets = torch::randint(0, config.vocab_size, {s.part, config.seq_len}, torch::kLong);
  if (s.context) {
    tokens = s.context->shard(tokens, 1);
    targets = s.context->shard(targets, 1);
  }
  const int64_t local_tokens = tokens.size(1);
  return measured_step_peak(before, optimizer, [&] {
    std::optional<dtrain::cp::ContextParallel::Scope> on_shards;
    if (s.context) on_shards.emplace(*s.context);
    if (engine.fsdp) engine.fsdp->gather_for_step(false);
    pipeline.step([&](const torch::Tensor& x) { return engine.forward(stage_forward, x); }, loss, tokens, targets,
                  {s.part / s.microbatches, local_tokens, config.dim}, torch::kFloat32,
                  [&](bool sync, const std::function<void()>& backward) {
                    if (sync || !engine.ddp) return backward();
                    auto guard = engine.ddp->no_sync();
                    backward();
                  });
    if (engine.fsdp) engine.fsdp->reduce_step_gradients();
    if (tied) pp::sum_tied_gradients(tied_weight, pipeline);
  });
}

// Each stage on every (dp, pp, tp) mesh of the world with pp > 1 and tp of
// 1 or 2, both schedules.
TEST(MeasuredLlama, PipelinePeakMatchesThePlan) {
  if (world().size() < 2) GTEST_SKIP() << "a pipeline needs two ranks";
  dtrain::memory::install_tracking_allocator();
  for (const bool tied : {false, true}) {
    StageRun s;
    s.config = measured_llama(tied);
    for (int stages = 2; stages <= world().size(); stages *= 2) {
      for (const int tp : {1, 2}) {
        if (world().size() % (stages * tp) != 0) continue;
        std::vector<std::pair<std::string, int>> dimensions{{"dp", -1}, {"pp", stages}};
        if (tp > 1) dimensions.emplace_back("tp", tp);
        const dtrain::DeviceMesh mesh(world_ptr(), dimensions);
        const int stage = mesh.rank("pp");
        const auto spec =
            plan::describe_llama_stage(s.config, s.part, s.microbatches, torch::kFloat32, stage, stages, tp);
        for (const auto schedule : {pp::Schedule::GPipe, pp::Schedule::OneFOneB}) {
          s.schedule = schedule;
          for (const PlannedRun& run : {PlannedRun{"ddp"}, PlannedRun{"fsdp"}}) {
            auto options = options_of(run, mesh.size("dp"), mesh.rank("dp"));
            options.schedule = schedule;
            const std::string where = run.name() + (tied ? ", tied, " : ", ") + pp::schedule_name(schedule) + " on " +
                                      mesh.describe() + ", stage " + std::to_string(stage);
            const int64_t measured = measured_stage_peak(s, mesh, mesh.comm("dp"), run, options, spec, where);
            expect_planned_peak(measured, plan::make_plan(spec, options), where);
          }
        }
      }
    }
  }
}

// Stages whose blocks run on sequence slices (--pp with --sequence-parallel,
// on (dp, 2, 2)) or on a ring's shards (--pp with --cp 2, on (dp, 2, 2, 1),
// the engine over dp x cp): 1F1B, tied, ddp and fsdp.
TEST(MeasuredLlama, PipelineOnSequenceSlicesAndShardsPeakMatchesThePlan) {
  if (world().size() % 4 != 0) GTEST_SKIP() << "pp 2 with tp 2 or cp 2 needs a multiple of 4 ranks";
  dtrain::memory::install_tracking_allocator();
  StageRun s;
  s.config = measured_llama(true);
  s.config.seq_len = 64;
  for (const bool ring : {false, true}) {
    std::vector<std::pair<std::string, int>> dimensions{{"dp", -1}, {"pp", 2}, {ring ? "cp" : "tp", 2}};
    dtrain::DeviceMesh mesh(world_ptr(), dimensions);  // flatten adds a group
    std::optional<dtrain::cp::ContextParallel> context;
    if (ring) context.emplace(mesh.comm("cp"));
    s.context = ring ? &*context : nullptr;
    s.sequence_parallel = !ring;
    const dtrain::CommPtr engine_group = ring ? mesh.flatten({"dp", "cp"}, "dp_cp") : mesh.comm("dp");
    const int stage = mesh.rank("pp");
    const auto spec = plan::describe_llama_stage(s.config, s.part, s.microbatches, torch::kFloat32, stage, 2,
                                                 ring ? 1 : 2, !ring, ring ? 2 : 1);
    for (const PlannedRun& run : {PlannedRun{"ddp"}, PlannedRun{"fsdp"}}) {
      auto options = options_of(run, engine_group->size(), engine_group->rank());
      const std::string where = run.name() + (ring ? ", ring attention" : ", sequence parallel") + " on " +
                                mesh.describe() + ", stage " + std::to_string(stage);
      const int64_t measured = measured_stage_peak(s, mesh, engine_group, run, options, spec, where);
      expect_planned_peak(measured, plan::make_plan(spec, options), where);
    }
  }
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
