#include "train/strategy.h"

#include "dtrain/comm_hooks.h"
#include "dtrain/ddp.h"
#include "dtrain/fsdp.h"
#include "dtrain/grad_norm.h"
#include "dtrain/mesh.h"
#include "dtrain/strategy_table.h"
#include "dtrain/tensor_parallel.h"
#include "checkpoint/held_state.h"
#include "train/initial_weights.h"
#include "common/timing.h"

#include <algorithm>
#include <set>
#include <utility>
#include <stdexcept>

namespace dtrain {

std::vector<std::string> strategy_names() {
  std::vector<std::string> names;
  for (const auto& row : strategy_table()) names.emplace_back(row.name);
  return names;
}

bool strategy_available(const std::string& strategy) {
  const StrategyInfo* row = find_strategy(strategy);
  return row && row->name == strategy;  // an alias is a manifest's word, not a --strategy
}

namespace train {
namespace {

// --grad-clip on a mesh (--tp, --pp): the norm of the whole model. Each
// parameter's squared norm counts once over the mesh: a tensor-parallel
// slice in full (summed over tp), a parameter replicated across tp 1/tp on
// each rank, the last stage's copy of the tied wte not at all (the first
// stage counts it), summed over tp and pp. `named` are this rank's
// parameters (or shards, with `shards_across` their sharding group).
double clip_on_mesh(const Model& model, const std::vector<std::pair<std::string, torch::Tensor>>& named,
                    double max_norm, Communicator* shards_across) {
  const std::set<std::string> split(model.tp_split_names.begin(), model.tp_split_names.end());
  const double replicated = model.tp_group ? 1.0 / model.tp_group->size() : 1.0;
  std::vector<torch::Tensor> parameters;
  std::vector<double> weights;
  for (const auto& [name, parameter] : named) {
    parameters.push_back(parameter);
    weights.push_back(name == model.tied_copy ? 0.0 : split.count(name) ? 1.0 : replicated);
  }
  return clip_grad_norm_of_parts(parameters, weights, max_norm,
                                 {shards_across, model.tp_group.get(), model.pp_group.get()});
}

// What a rank holds under --tp or --pp, whole on each dp rank (single, ddp),
// as a checkpoint of the whole model.
HeldModel held_on_the_mesh(const Model& model) { return held_on_mesh(*model.module, *model.mesh, model.whole.get()); }

// Under --tp a checkpoint is the whole mesh's: every rank of the world
// writes and reads its place in the global tensors (dtrain::held_on_mesh),
// so that it loads on another mesh, strategy or world size.
void save_on_mesh(const Model& model, const HeldModel& held, const std::string& dir, torch::optim::Optimizer& optimizer,
                  int64_t step, const std::map<std::string, std::string>& extra) {
  save_checkpoint(dir, held, &optimizer, step, model.mesh->world(), extra);
}
CheckpointManifest load_on_mesh(const Model& model, const HeldModel& held, const std::string& dir,
                                torch::optim::Optimizer& optimizer) {
  return load_checkpoint(dir, held, &optimizer, model.mesh->world());
}

torch::Tensor parameter_named(const torch::nn::Module& module, const std::string& name) {
  const auto named = module.named_parameters();
  const auto* found = named.find(name);
  return found ? *found : torch::Tensor();
}

std::vector<std::pair<std::string, torch::Tensor>> named_parameters(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : module.named_parameters()) named.emplace_back(item.key(), item.value());
  return named;
}

// One process, the whole model, no communication.
class SingleProcess final : public Strategy {
 public:
  explicit SingleProcess(Model& model) : model_(model) {}
  std::string name() const override { return "single"; }
  torch::Tensor forward(const torch::Tensor& inputs) override { return model_.forward(inputs); }
  std::vector<torch::Tensor> optimizer_parameters() override { return model_.module->parameters(); }
  double clip_grad_norm(double max_norm) override {
    if (model_.mesh) return clip_on_mesh(model_, named_parameters(*model_.module), max_norm, nullptr);
    return dtrain::clip_grad_norm(model_.module->parameters(), max_norm, 2.0, /*shards_across=*/nullptr);
  }
  void save(const std::string& dir, torch::optim::Optimizer& optimizer, int64_t step,
            const std::map<std::string, std::string>& extra) override {
    if (model_.mesh) return save_on_mesh(model_, held(), dir, optimizer, step, extra);
    save_checkpoint(dir, *model_.module, &optimizer, step, nullptr, extra);
  }
  CheckpointManifest load(const std::string& dir, torch::optim::Optimizer& optimizer) override {
    if (model_.mesh) return load_on_mesh(model_, held(), dir, optimizer);
    return load_checkpoint(dir, *model_.module, &optimizer);
  }
  HeldModel held() override {
    return model_.mesh ? held_on_the_mesh(model_) : detail::held_by_module(*model_.module, nullptr);
  }
  torch::Tensor updated_tensor(const std::string& name) override { return parameter_named(*model_.module, name); }
  void load_initial_weights(const std::string& path) override {
    if (model_.mesh) return train::load_initial_weights(held(), path, model_.hugging_face_layout);
    train::load_initial_weights(*model_.module, path, model_.hugging_face_layout);
  }

 private:
  Model& model_;
};

// A full replica per rank; gradients averaged by DDP during backward.
class DataParallel final : public Strategy {
 public:
  DataParallel(Model& model, CommPtr world, DDPOptions options, std::string name)
      : model_(model), world_(world), ddp_(model.module, std::move(world), std::move(options)), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  double last_backward_wait_s() const override { return ddp_.last_step().exposed_comm_s; }
  torch::Tensor forward(const torch::Tensor& inputs) override {
    ddp_.before_forward();
    return ddp_.finish_forward(model_.forward(ddp_.compute_input(inputs)));
  }
  std::vector<torch::Tensor> optimizer_parameters() override { return ddp_.parameters(); }
  double clip_grad_norm(double max_norm) override {
    if (model_.mesh) return clip_on_mesh(model_, named_parameters(*model_.module), max_norm, nullptr);
    return dtrain::clip_grad_norm(ddp_, max_norm);
  }
  // Microbatches (--pp): gradients accumulate locally and are averaged over
  // dp in the step's last backward only.
  void run_backward(bool last_in_step, const std::function<void()>& backward) override {
    if (last_in_step) return backward();
    auto accumulate_only = ddp_.no_sync();
    backward();
  }
  // Every replica is equal: each rank writes 1/world of it.
  void save(const std::string& dir, torch::optim::Optimizer& optimizer, int64_t step,
            const std::map<std::string, std::string>& extra) override {
    if (model_.mesh) return save_on_mesh(model_, held(), dir, optimizer, step, extra);
    save_checkpoint(dir, *model_.module, &optimizer, step, world_, extra);
  }
  CheckpointManifest load(const std::string& dir, torch::optim::Optimizer& optimizer) override {
    if (model_.mesh) return load_on_mesh(model_, held(), dir, optimizer);
    return load_checkpoint(dir, *model_.module, &optimizer, world_);
  }
  HeldModel held() override {
    return model_.mesh ? held_on_the_mesh(model_) : detail::held_by_module(*model_.module, world_);
  }
  torch::Tensor updated_tensor(const std::string& name) override { return parameter_named(*model_.module, name); }
  void load_initial_weights(const std::string& path) override {
    if (model_.mesh) return train::load_initial_weights(held(), path, model_.hugging_face_layout);
    train::load_initial_weights(*model_.module, path, model_.hugging_face_layout);
  }

 private:
  Model& model_;
  CommPtr world_;
  DistributedDataParallelBase ddp_;
  std::string name_;  // ddp, or single with mixed precision
};

// Parameters, gradients and optimizer state sharded by FSDP (zero1, zero2,
// fsdp, hsdp): the optimizer updates this rank's shards.
class FullySharded final : public Strategy {
 public:
  FullySharded(Model& model, CommPtr world, FSDPOptions options, std::string name, bool gather_per_microbatch)
      : model_(model),
        fsdp_(model.module, std::move(world), std::move(options)),
        name_(std::move(name)),
        gather_per_microbatch_(gather_per_microbatch) {}
  std::string name() const override { return name_; }
  torch::Tensor forward(const torch::Tensor& inputs) override {
    return fsdp_.forward_root([&] { return model_.forward(fsdp_.compute_input(inputs)); });
  }
  std::vector<torch::Tensor> optimizer_parameters() override { return fsdp_.parameters(); }
  double clip_grad_norm(double max_norm) override {
    if (model_.mesh) {
      std::vector<std::pair<std::string, torch::Tensor>> shards;
      for (const auto& shard : fsdp_.parameter_shards()) shards.emplace_back(shard.name, shard.parameter);
      return clip_on_mesh(model_, shards, max_norm, &fsdp_.shard_group());
    }
    return dtrain::clip_grad_norm(fsdp_, max_norm);
  }
  std::optional<FSDPPrefetchTuning> prefetch_tuning() const override {
    auto tuning = fsdp_.prefetch_tuning();
    const auto& options = fsdp_.options();
    // Without tuning, the configured setting is the choice.
    if (!tuning.decided) tuning.prefetch = options.forward_prefetch || options.backward_prefetch != BackwardPrefetch::None;
    return tuning;
  }
  void save(const std::string& dir, torch::optim::Optimizer& optimizer, int64_t step,
            const std::map<std::string, std::string>& extra) override {
    if (model_.mesh) return save_on_mesh(model_, held(), dir, optimizer, step, extra);
    save_checkpoint(dir, fsdp_, &optimizer, step, extra);
  }
  CheckpointManifest load(const std::string& dir, torch::optim::Optimizer& optimizer) override {
    if (model_.mesh) return load_on_mesh(model_, held(), dir, optimizer);
    return load_checkpoint(dir, fsdp_, &optimizer);
  }
  HeldModel held() override {
    return model_.mesh ? held_on_mesh(fsdp_, *model_.mesh, model_.whole.get()) : detail::held_by_fsdp(fsdp_);
  }
  void begin_microbatches() override { fsdp_.gather_for_step(gather_per_microbatch_); }
  void end_microbatches() override { fsdp_.reduce_step_gradients(); }
  torch::Tensor updated_tensor(const std::string& name) override {
    for (const auto& shard : fsdp_.parameter_shards())
      if (shard.name == name) return shard.parameter;
    return {};
  }
  // Each rank reads only the pieces it holds (under --tp, its slices).
  void load_initial_weights(const std::string& path) override {
    train::load_initial_weights(held(), path, model_.hugging_face_layout);
  }

 private:
  Model& model_;
  FullyShardedBase fsdp_;
  std::string name_;
  bool gather_per_microbatch_;
};


}  // namespace

// --mixed-precision and --reduce-dtype as the engines' policy (the same for
// DDP and FSDP): compute in bf16, reduce in fp32 or bf16, outputs in fp32.
MixedPrecision mixed_precision_of(const StrategyOptions& options) {
  MixedPrecision policy;
  if (options.mixed_precision == "bf16") policy.param_dtype = torch::kBFloat16;
  if (options.reduce_dtype == "bf16") policy.reduce_dtype = torch::kBFloat16;
  return policy;
}

// zero1 / zero2 / fsdp / hsdp as FSDP options. hsdp shards inside groups of
// half the ranks (two replicas) when the world is even and at least 4,
// otherwise over the whole world.
FSDPOptions fsdp_options(const StrategyOptions& options, int world_size) {
  FSDPOptions fsdp;
  fsdp.strategy = strategy_info(options.name).sharding;
  fsdp.hybrid_group_size = (world_size % 2 == 0 && world_size >= 4) ? world_size / 2 : world_size;
  fsdp.mixed_precision = mixed_precision_of(options);
  if (options.fsdp_prefetch == "off") {
    fsdp.forward_prefetch = false;
    fsdp.backward_prefetch = BackwardPrefetch::None;
  }
  // Three steps of each after two warm-up steps: enough for a median that a
  // single disturbed step does not decide (Note [prefetch tuning]).
  if (options.fsdp_prefetch == "auto") fsdp.prefetch_tuning_steps = 3;
  fsdp.compression = parse_collective_compression(options.fsdp_compress);
  fsdp.activation_checkpointing = options.activation_checkpointing;
  fsdp.device = options.device;
  fsdp.comm_streams = options.comm_streams;
  fsdp.float8_all_gather = options.float8_all_gather;
  return fsdp;
}

void check_strategy(const StrategyOptions& options, int world_size) {
  if (!strategy_available(options.name))
    throw std::invalid_argument("--strategy '" + options.name + "' is not one of " + join(strategy_names()));
  const StrategyInfo& row = strategy_info(options.name);
  if (!row.multi_rank && world_size > 1)
    throw std::invalid_argument("--strategy " + options.name + " trains one process, but this job has " +
                                std::to_string(world_size) + " ranks: use --strategy ddp (or --nproc 1)");
  const std::vector<std::string> compressions{"none", "bf16", "powersgd", "topk"};
  if (std::find(compressions.begin(), compressions.end(), options.compress) == compressions.end())
    throw std::invalid_argument("--compress '" + options.compress + "' is not one of " + join(compressions));
  if (options.compress != "none" && !row.compression)
    throw std::invalid_argument("--compress " + options.compress + " compresses DDP's gradient all-reduce: it needs --strategy " +
                                strategy_list([](const StrategyInfo& r) { return r.compression; }) + ", not " +
                                options.name);
  if (options.fsdp_prefetch != "on" && options.fsdp_prefetch != "off" && options.fsdp_prefetch != "auto")
    throw std::invalid_argument("--fsdp-prefetch '" + options.fsdp_prefetch + "' is not one of on, off, auto");
  // "auto" is the default for every strategy; an explicit on/off asks for
  // something only the FSDP engine does.
  if (options.fsdp_prefetch != "auto")
    require_fsdp_engine(options.name, "--fsdp-prefetch " + options.fsdp_prefetch +
                                          " sets the FSDP engine's all-gather prefetch");
  // The FSDP engine recomputes its units in their backward; DDP and the
  // parameter server have no such hook.
  if (options.activation_checkpointing)
    require_fsdp_engine(options.name, kActivationCheckpointingNeedsFsdp);
  const auto fsdp_compress = parse_collective_compression(options.fsdp_compress);  // throws naming the flag
  if (fsdp_compress != CollectiveCompression{}) {
    if (!row.fsdp_compression)
      throw std::invalid_argument("--fsdp-compress compresses the sharded strategies' all-gathers and reduce-scatters: "
                                  "it needs --strategy " +
                                  strategy_list([](const StrategyInfo& r) { return r.fsdp_compression; }) + ", not " +
                                  options.name + (row.compression ? " (ddp compresses with --compress)" : ""));
    if (row.sharding == Sharding::OptimizerOnly && fsdp_compress.grads != GradCompression::None)
      throw std::invalid_argument(std::string("--fsdp-compress grads=") + to_string(fsdp_compress.grads) +
                                  ": --strategy " + options.name +
                                  " all-reduces gradients (no reduce-scatter to compress); use grads=none with it, "
                                  "or --strategy zero2, fsdp or hsdp");
  }
  if (options.mixed_precision != "none" && options.mixed_precision != "bf16")
    throw std::invalid_argument("--mixed-precision '" + options.mixed_precision + "' is not one of none, bf16");
  // The parameter server moves float32 parameters and gradients (ps.h).
  if (options.mixed_precision == "bf16" && !row.bf16)
    throw std::invalid_argument(
        "--mixed-precision bf16 is not available with --strategy " + options.name +
        ": the parameter server trains in fp32 (use --mixed-precision none, or --strategy " +
        strategy_list([](const StrategyInfo& r) { return r.bf16; }) + ")");
  if (options.reduce_dtype != "fp32" && options.reduce_dtype != "bf16")
    throw std::invalid_argument("--reduce-dtype '" + options.reduce_dtype + "' is not one of fp32, bf16");
  if (options.reduce_dtype == "bf16" && options.mixed_precision != "bf16")
    throw std::invalid_argument(
        "--reduce-dtype bf16 is part of the bf16 mixed-precision policy: add --mixed-precision bf16 (to reduce fp32 "
        "gradients in bf16 alone, use --compress bf16 with --strategy ddp)");
}

std::unique_ptr<Strategy> wrap_model(Model& model, const StrategyOptions& options, CommPtr world) {
  check_strategy(options, world->size());
  switch (strategy_info(options.name).engine) {
    case StrategyEngine::ParameterServer:
      throw std::invalid_argument("--strategy " + options.name + " does not wrap a model: run_training hands it to "
                                  "train::run_parameter_server (src/train/ps_training.h)");
    case StrategyEngine::FSDP: {
      auto sharded = std::make_unique<FullySharded>(model, world, fsdp_options(options, world->size()), options.name,
                                                    options.gather_per_microbatch);
      // The shards moved piece by piece; the buffers (a few, whole on every rank) follow.
      if (options.device)
        for (auto& buffer : model.module->buffers()) buffer.set_data(buffer.to(*options.device));
      return sharded;
    }
    case StrategyEngine::SingleProcess:
    case StrategyEngine::DDP: break;
  }
  if (options.device) model.module->to(*options.device);
  // bf16 compute with fp32 masters on one process is DDP's mixed precision
  // on its one rank (the bucket "all-reduce" over one rank is a copy).
  if (strategy_info(options.name).engine == StrategyEngine::SingleProcess && options.mixed_precision == "none")
    return std::make_unique<SingleProcess>(model);
  DDPOptions ddp_options;
  ddp_options.comm_hook = hooks::by_name(options.compress);
  ddp_options.comm_streams = options.comm_streams;
  ddp_options.find_unused_parameters = options.chunked_stage;
  if (options.mixed_precision != "none") ddp_options.mixed_precision = mixed_precision_of(options);
  return std::make_unique<DataParallel>(model, std::move(world), std::move(ddp_options), options.name);
}

}  // namespace train
}  // namespace dtrain
