// train::plan_model (src/train/plan_model.h).
//
// Note [probe plan]
// A model dtrain has no formulas for is planned from itself. Its parameters
// are exact: the module is built deferred (names and shapes, no storage) and
// split into units by the FSDP wrap policy the engines use. Its activations
// are measured: the model is built for real, its gradients allocated (as they
// are in every step after the first), and one forward, loss and backward run
// on the first samples of its training data at batches b and 2b under the
// tracking allocator. What stays allocated after the forward and the loss is
// the root's activation_bytes (output and loss included); how far the
// backward rises above that is its backward_workspace_bytes. Both are fitted
// as a + s x batch through the two probes and read at batch_per_rank: the
// saved tensors of a network are linear in its batch, and the constant part
// (kernels' scratch) is kept. The probe is on the CPU in fp32, the compute of
// a run without --mixed-precision; a run at another dtype is refused rather
// than guessed. The one unit holds all activations, so under FSDP with
// declared units the plan keeps every unit's activations on the root: the
// same total at the peak, which is after the forward. A run of several
// ranks computes some layers otherwise than one (SyncBatchNorm's all-reduce
// path saves its centred input and more), so the probe takes those paths
// when the plan is of several data-parallel ranks.
//
// Under --tp the probe is of one rank's slice: the spec's tensor_parallel
// hook builds it on a stand-in group of tp ranks (dtrain/stand_in_group.h),
// whose collectives give every tensor the shape the real group gives it, so
// the slice's parameters and saved activations are this rank's. What the
// stand-in was asked to move during a probe step is the tp group's traffic
// per step, fitted through the two probes as the activations are.
#include "train/plan_model.h"

#include "dtrain/deferred_init.h"
#include "dtrain/memory.h"
#include "dtrain/stand_in_group.h"
#include "dtrain/sync_batch_norm.h"
#include "dtrain/model_spec.h"
#include "fsdp/wrap_policy.h"
#include "train/model.h"
#include "train/training_data.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <stdexcept>

namespace dtrain::train {
namespace {

int64_t bytes_of(const torch::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

struct ProbeStep {
  int64_t batch = 0;
  int64_t input_bytes = 0;
  int64_t after_forward = 0;  // above the start: activations, output, loss
  int64_t backward_rise = 0;  // the backward's peak above after_forward (0 if it never rises)
  StandInTraffic traffic;     // --tp: what the stand-in tp group moved in the step
};

// One forward, loss and backward of `model` at `batch` samples.
ProbeStep probe_step(Model& model, const data::Dataset& train, int64_t batch, const StandInTraffic* traffic) {
  if (train.size() < batch)
    throw std::invalid_argument("plan: the probe needs " + std::to_string(batch) + " training samples, the data has " +
                                std::to_string(train.size()));
  std::vector<int64_t> indices(static_cast<size_t>(batch));
  std::iota(indices.begin(), indices.end(), 0);
  const data::Batch part = train.get_batch(indices);
  ProbeStep probe;
  probe.batch = batch;
  const StandInTraffic before = traffic ? *traffic : StandInTraffic{};
  probe.input_bytes = bytes_of(part.inputs) + bytes_of(part.targets);
  const int64_t start = memory::live_bytes();
  memory::reset_peak();
  {
    torch::Tensor loss = model.loss(model.forward(part.inputs), part.targets).sum();
    probe.after_forward = memory::live_bytes() - start;
    memory::reset_peak();
    loss.backward();
    probe.backward_rise = std::max<int64_t>(0, memory::peak_bytes() - start - probe.after_forward);
  }
  if (traffic) {
    probe.traffic = *traffic;
    for (auto& [name, operation] : probe.traffic.operations) {
      const auto was = before.operations.find(name);
      if (was == before.operations.end()) continue;
      operation.calls -= was->second.calls;
      operation.payload_bytes -= was->second.payload_bytes;
    }
  }
  return probe;
}

// a + s x batch through two probes, read at `batch`; never below 0.
int64_t extrapolate(int64_t at_small, int64_t at_large, const ProbeStep& small, const ProbeStep& large, int64_t batch) {
  const double slope = static_cast<double>(at_large - at_small) / static_cast<double>(large.batch - small.batch);
  const double value = static_cast<double>(at_small) + slope * static_cast<double>(batch - small.batch);
  return std::max<int64_t>(0, static_cast<int64_t>(value + 0.5));
}

// The model's SyncBatchNorm layers (dtrain/sync_batch_norm.h) on a one-rank
// group, computing as they do on several ranks.
void take_multi_rank_paths(torch::nn::Module& module) {
  std::vector<SyncBatchNormImpl*> layers;
  for (const auto& child : module.modules(/*include_self=*/true))
    if (auto* sync = child->as<SyncBatchNormImpl>()) layers.push_back(sync);
  if (layers.empty()) return;
  const CommPtr one_rank = init(InitOptions{.backend = "self"});  // the layers hold it as long as the probe's model
  for (auto* layer : layers) {
    layer->set_comm(one_rank);
    layer->set_multi_rank_path(true);
  }
}

plan::ModelSpec probe_model(const TrainConfig& config, int64_t batch_per_rank, int data_parallel_ranks,
                            std::string& activations) {
  memory::install_tracking_allocator();
  plan::ModelSpec described;
  described.batch_per_rank = batch_per_rank;
  described.description = describe_model_for_plan(config);
  // --tp: tp rank 0's slice (every rank's slices are the same sizes).
  std::shared_ptr<StandInTraffic> traffic;
  CommPtr tp_group;
  if (config.tp > 1) {
    traffic = std::make_shared<StandInTraffic>();
    tp_group = stand_in_group(config.tp, 0, traffic);
    described.tensor_parallel = config.tp;
    described.description += ", tensor-parallel over " + std::to_string(config.tp) + " ranks" +
                             (config.sequence_parallel ? " (sequence parallel)" : "");
  }
  {  // the parameters, exactly: the model deferred, split as fully_shard splits it
    torch::manual_seed(config.seed);
    DeferredConstruction deferring;
    const Model deferred = build_model(config, /*deferred=*/false, tp_group);
    for (const auto& unit : detail::plan_units(deferred.module, WrapPolicy{})) {
      plan::UnitSpec spec;
      spec.name = unit.name;
      for (size_t i = 0; i < unit.parameters.size(); ++i) spec.parameters.push_back({unit.parameter_names[i], unit.parameters[i].numel()});
      described.units.push_back(spec);
    }
    for (const auto& buffer : deferred.module->buffers()) described.buffer_bytes += buffer.numel() * static_cast<int64_t>(buffer.element_size());
  }
  const TrainingData data = load_training_data(config);
  torch::manual_seed(config.seed);
  Model model = build_model(config, /*deferred=*/false, tp_group);
  model.module->train();
  // A SyncBatchNorm of a run of several ranks takes its all-reduce path,
  // which saves other tensors than one rank's batch_norm: probe that path.
  if (data_parallel_ranks > 1) take_multi_rank_paths(*model.module);
  for (auto& parameter : model.module->parameters()) parameter.mutable_grad() = torch::zeros_like(parameter);
  const int64_t small_batch = std::clamp<int64_t>(batch_per_rank / 2, 1, 8);
  const ProbeStep small = probe_step(model, *data.train, small_batch, traffic.get());
  const ProbeStep large = probe_step(model, *data.train, 2 * small_batch, traffic.get());
  plan::UnitSpec& root = described.units.front();
  root.activation_bytes = extrapolate(small.after_forward, large.after_forward, small, large, batch_per_rank);
  root.backward_workspace_bytes = extrapolate(small.backward_rise, large.backward_rise, small, large, batch_per_rank);
  described.input_bytes = extrapolate(small.input_bytes, large.input_bytes, small, large, batch_per_rank);
  for (const auto& [name, operation] : large.traffic.operations) {
    if (operation.calls == 0) continue;  // issued before the probe steps (construction)
    const auto at_small = small.traffic.operations.find(name);
    const int64_t small_bytes = at_small == small.traffic.operations.end() ? 0 : at_small->second.payload_bytes;
    described.collectives.push_back({name, "measured, tensor parallel", config.tp, operation.calls,
                                     extrapolate(small_bytes, operation.payload_bytes, small, large, batch_per_rank), 0});
  }
  activations = "measured: one forward and backward at " + std::to_string(small.batch) + " and " +
                std::to_string(large.batch) + " samples, scaled to " + std::to_string(batch_per_rank) +
                (model_spec(config).plan_description ? " (--probe)" : " (the model's spec has no plan_description)");
  return described;
}

}  // namespace

std::string describe_model_for_plan(const TrainConfig& config) {
  const ModelSpec& spec = model_spec(config);
  return spec.describe ? spec.describe(config) : spec.name;
}

PlannedModel plan_model(const TrainConfig& config, int64_t batch_per_rank, torch::ScalarType compute, bool probe,
                        int data_parallel_ranks, bool probe_always) {
  const ModelSpec& spec = model_spec(config);
  PlannedModel planned;
  if (spec.plan_description && !(probe && probe_always)) {
    planned.model = spec.plan_description(config, batch_per_rank, compute);
    planned.activations = "described by the model's spec";
    return planned;
  }
  if (!probe)
    throw std::invalid_argument("--model " + spec.name + " has no ModelSpec::plan_description: `dtrain plan` measures it");
  const std::string why = spec.plan_description ? "--probe measures it" : "it has no ModelSpec::plan_description";
  if (compute != torch::kFloat32)
    throw std::invalid_argument("plan: --model " + spec.name + " is probed (" + why +
                                "), and the probe measures fp32 compute only: plan it without --mixed-precision");
  if (config.pp > 1)
    throw std::invalid_argument("plan: --model " + spec.name + " is planned by a probe, which measures a whole model "
                                "or a tensor-parallel slice of it: not with --pp (that needs "
                                "ModelSpec::plan_stage_description)");
  planned.model = probe_model(config, batch_per_rank, data_parallel_ranks, planned.activations);
  return planned;
}

}  // namespace dtrain::train
