#include "fsdp/fsdp_state.h"
#include "fsdp/schedule_rules.h"

#include "comm/replicas.h"
#include "fsdp/activation_checkpoint.h"
#include "fsdp/compression.h"
#include "fsdp/reduction_order.h"
#include "fsdp/wrap_policy.h"

#include <dtrain/deferred_init.h>
#include <dtrain/float8.h>
#include <dtrain/memory.h>
#include <dtrain/trace.h>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <algorithm>
#include <map>
#include <stdexcept>

namespace dtrain::detail {
namespace {

// Which engine owns each unit's module, for Sharded<> and run_unit().
std::mutex g_registry_mutex;
std::map<const torch::nn::Module*, std::pair<FSDPState*, Unit*>>& registry() {
  static std::map<const torch::nn::Module*, std::pair<FSDPState*, Unit*>> units;
  return units;
}

class UnitGradientHook : public torch::autograd::PostAccumulateGradHook {
 public:
  UnitGradientHook(std::function<void()> ready) : ready_(std::move(ready)) {}
  void operator()(const torch::autograd::Variable& /*tensor*/) override { ready_(); }

 private:
  std::function<void()> ready_;
};

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// Every DeferredInit model inside `root` takes rank 0's init seed.
void agree_on_init_seeds(Communicator& comm, torch::nn::Module& root) {
  const auto models = deferred_init_models(root);
  if (comm.size() == 1 || models.empty()) return;
  auto seeds = torch::empty({static_cast<int64_t>(models.size())}, torch::kInt64);
  for (size_t i = 0; i < models.size(); ++i) seeds[static_cast<int64_t>(i)] = static_cast<int64_t>(models[i]->init_seed());
  comm.blocking().broadcast(seeds, 0);
  for (size_t i = 0; i < models.size(); ++i)
    models[i]->set_init_seed(static_cast<uint64_t>(seeds[static_cast<int64_t>(i)].item<int64_t>()));
}

}  // namespace

std::pair<FSDPState*, Unit*> lookup_unit(const torch::nn::Module* module) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  auto it = registry().find(module);
  if (it == registry().end()) return {nullptr, nullptr};
  return it->second;
}

FSDPState::FSDPState(std::shared_ptr<torch::nn::Module> root, CommPtr comm, FSDPOptions options)
    : root_(std::move(root)), comm_(std::move(comm)), options_(std::move(options)),
      tuner_(options_.forward_prefetch || options_.backward_prefetch != BackwardPrefetch::None
                 ? options_.prefetch_tuning_steps
                 : 0) {
  if (!root_) throw std::invalid_argument("FSDP: the module is null");
  if (options_.prefetch_tuning_steps < 0) {
    throw std::invalid_argument("FSDP: prefetch_tuning_steps must be 0 (off) or positive");
  }
  if (!comm_) throw std::invalid_argument("FSDP: the communicator is null; pass the one dtrain::init() returned");
  if (options_.max_inflight_all_gathers < 1) {
    throw std::invalid_argument("FSDP: max_inflight_all_gathers must be at least 1");
  }
  if (options_.max_inflight_reductions < 1) {
    throw std::invalid_argument("FSDP: max_inflight_reductions must be at least 1");
  }
  for (auto dtype : {options_.mixed_precision.param_dtype, options_.mixed_precision.reduce_dtype,
                     options_.mixed_precision.output_dtype}) {
    if (!c10::isFloatingType(dtype)) {
      throw std::invalid_argument("FSDP: mixed precision dtypes must be floating point, got " + dtype_name(dtype));
    }
  }
  check_compression();
  build_groups();

  std::vector<NamedTensor> everything;
  for (const auto& item : root_->named_parameters(true)) everything.push_back({"parameter", item.key(), item.value()});
  for (const auto& item : root_->named_buffers(true)) everything.push_back({"buffer", item.key(), item.value()});
  check_same_on_all_ranks(*comm_, everything, "FSDP");

  // Rank 0's weights everywhere, one unit at a time: a deferred model takes
  // rank 0's init seeds (each rank then builds the same values for its own
  // pieces); a built one has each unit broadcast just before it is sharded.
  // No rank ever holds more than its shards plus one unit's worth of copies.
  const bool deferred = has_deferred_storage(*root_);
  if (deferred) agree_on_init_seeds(*comm_, *root_);
  build_units(deferred ? deferred_modules(*root_) : std::vector<DeferredModule>{});
  for (auto& unit : units_) unit->count_bytes_in(&running_step_);

  std::vector<torch::Tensor> buffers;
  for (const auto& item : root_->named_buffers(true)) {
    if (!is_deferred(item.value())) buffers.push_back(item.value());
  }
  broadcast_from_rank0(*comm_, buffers);
  install_gradient_hooks();
}

FSDPState::~FSDPState() {
  for (auto& unit : units_) unit->settle_in_flight();
  remove_gradient_hooks();
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  for (auto it = registry().begin(); it != registry().end();) {
    it = it->second.first == this ? registry().erase(it) : std::next(it);
  }
}

void FSDPState::check_compression() const {
  std::vector<CollectiveCompression> all{options_.compression};
  for (const auto& [name, compression] : options_.compression_by_unit) all.push_back(compression);
  for (const auto& c : all) {
    if (c.block_size < 1)
      throw std::invalid_argument("FSDP: compression block_size must be at least 1, got " + std::to_string(c.block_size));
    if (c.params == ParamCompression::FP8) check_fp8_supported();
    if (c.grads != GradCompression::None && options_.strategy == Sharding::OptimizerOnly)
      throw std::invalid_argument(std::string("FSDP: grads=") + to_string(c.grads) +
                                  " compresses the gradient reduce-scatter, but Sharding::OptimizerOnly (zero1) "
                                  "all-reduces gradients; use grads=none there, or GradOp (zero2) / Full (fsdp)");
  }
}

void FSDPState::check_compression_overrides() const {
  for (const auto& [name, compression] : options_.compression_by_unit) {
    bool found = false;
    std::string names;
    for (const auto& unit : units_) {
      found = found || unit->name() == name;
      names += (names.empty() ? "" : ", ") + unit->display_name();
    }
    if (!found)
      throw std::invalid_argument("FSDP: compression_by_unit names '" + name + "', which is no unit; the units are " +
                                  names + " (\"\" is the root)");
  }
}

FSDPStepStats FSDPState::last_step() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return last_step_;
}

void FSDPState::build_groups() {
  const int world = comm_->size(), rank = comm_->rank();
  switch (options_.strategy) {
    case Sharding::Full:
    case Sharding::GradOp:
    case Sharding::OptimizerOnly:
      shard_group_ = comm_;
      break;
    case Sharding::None:
      shard_group_ = world == 1 ? comm_ : comm_->split(rank, 0);
      replicate_group_ = world == 1 ? nullptr : comm_;
      break;
    case Sharding::Hybrid: {
      const int group = options_.hybrid_group_size;
      if (group < 1 || world % group != 0) {
        throw std::invalid_argument("FSDP: hybrid_group_size must divide the world size " + std::to_string(world) +
                                    " (got " + std::to_string(group) + ")");
      }
      shard_group_ = group == world ? comm_ : comm_->split(rank / group, rank);
      replicate_group_ = group == 1 ? comm_ : (group == world ? nullptr : comm_->split(rank % group, rank));
      break;
    }
  }
}

void FSDPState::build_units(const std::vector<DeferredModule>& deferred) {
  UnitGroups groups{shard_group_.get(), replicate_group_.get()};
  // Which deferred module owns each parameter.
  std::map<const c10::TensorImpl*, const DeferredModule*> owner_of;
  for (const auto& module : deferred) {
    for (const auto& item : module.module->named_parameters(false)) owner_of[item.value().unsafeGetTensorImpl()] = &module;
  }
  std::vector<char> materialised(deferred.size(), 0);
  for (auto& plan : plan_units(root_, options_.wrap)) {
    std::vector<torch::Tensor> built;
    for (const auto& p : plan.parameters) {
      if (!is_deferred(p)) built.push_back(p);
    }
    broadcast_from_rank0(*comm_, built);
    const std::string phase = "construction of FSDP unit " + (plan.name.empty() ? std::string("(root)") : "'" + plan.name + "'");
    const memory::Phase in_phase(phase);
    units_.push_back(std::make_unique<Unit>(plan.name, plan.module.get(), std::move(plan.parameter_names),
                                            std::move(plan.parameters), groups, options_));
    Unit& unit = *units_.back();
    unit.set_index(static_cast<int>(units_.size() - 1));
    // Deferred modules one at a time: full size, initialised, cut to this
    // rank's pieces, freed.
    auto& entries = unit.flat().entries();
    for (size_t i = 0; i < entries.size(); ++i) {
      if (!is_deferred(entries[i].param)) continue;
      auto it = owner_of.find(entries[i].param.unsafeGetTensorImpl());
      if (it == owner_of.end()) throw std::logic_error("FSDP: no deferred module owns parameter '" + entries[i].name + "'");
      const DeferredModule& module = *it->second;
      const auto index = static_cast<size_t>(&module - deferred.data());
      if (materialised[index]) {
        throw std::invalid_argument("FSDP: module '" + module.name + "' has parameters in two units (its parameter '" +
                                    entries[i].name + "' is in " + unit.display_name() +
                                    "); a deferred module must lie inside one unit");
      }
      materialize_module(module);
      materialised[index] = 1;
      for (size_t j = i; j < entries.size(); ++j) {
        auto owner = owner_of.find(entries[j].param.unsafeGetTensorImpl());
        if (owner != owner_of.end() && owner->second == &module) unit.flat().take_piece(j);
      }
    }
    if (!unit.flat().all_pieces_taken()) {
      throw std::invalid_argument("FSDP: unit " + unit.display_name() +
                                  " shares a deferred module with another unit; a deferred module must lie inside one unit");
    }
  }
  // Modules with deferred buffers only (their buffers stay whole on every rank).
  for (size_t i = 0; i < deferred.size(); ++i) {
    if (!materialised[i]) materialize_module(deferred[i]);
  }
  // Every unit's collectives on the same two streams (on a CUDA device).
  std::optional<c10::Device> device = options_.device;
  for (const auto& unit : units_) {
    if (!device && unit->flat().shard().defined()) device = unit->flat().shard().device();
  }
  gather_stream_ = CommStream(device, options_.comm_streams, "cuda all-gather");
  reduce_stream_ = CommStream(device, options_.comm_streams, "cuda reduce-scatter");
  for (auto& unit : units_) unit->use_streams({&gather_stream_, &reduce_stream_});
  // Before the registry knows the units: a constructor that throws leaves
  // no entry behind.
  check_compression_overrides();
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  for (size_t i = 1; i < units_.size(); ++i) {
    auto [it, fresh] = registry().try_emplace(units_[i]->module(), this, units_[i].get());
    if (!fresh) {
      throw std::invalid_argument("FSDP: module " + units_[i]->display_name() +
                                  " already belongs to another fully_shard() call");
    }
  }
}

void FSDPState::install_gradient_hooks() {
  for (auto& unit : units_) {
    auto& entries = unit->flat().entries();
    for (size_t i = 0; i < entries.size(); ++i) {
      if (!entries[i].param.requires_grad()) continue;
      if (torch::autograd::impl::post_acc_grad_hooks(entries[i].param)) {
        throw std::invalid_argument("FSDP: parameter '" + entries[i].name +
                                    "' already has a post-accumulate-grad hook; is the model already wrapped by DDP "
                                    "or FSDP? Wrap each model once.");
      }
      Unit* owner = unit.get();
      torch::autograd::impl::set_post_acc_grad_hooks(
          entries[i].param, std::make_unique<UnitGradientHook>([this, owner, i] { on_gradient_ready(*owner, i); }));
    }
  }
}

void FSDPState::remove_gradient_hooks() {
  for (auto& unit : units_) {
    for (auto& entry : unit->flat().entries()) {
      auto& hook = torch::autograd::impl::post_acc_grad_hooks(entry.param);
      if (dynamic_cast<UnitGradientHook*>(hook.get())) hook.reset();
    }
  }
}

Unit* FSDPState::unit_for(const torch::nn::Module* module) {
  for (size_t i = 1; i < units_.size(); ++i) {
    if (units_[i]->module() == module) return units_[i].get();
  }
  return nullptr;
}

torch::Tensor FSDPState::to_compute_dtype(const torch::Tensor& input) const {
  const auto dtype = options_.mixed_precision.param_dtype;
  if (!input.defined() || !input.is_floating_point() || input.scalar_type() == dtype) return input;
  return input.to(dtype);
}

bool FSDPState::reshard_after_forward(const Unit& unit) const {
  return fsdp_rules::reshard_after_forward(options_.strategy, &unit == units_[0].get());
}

bool FSDPState::free_after_backward() const { return fsdp_rules::free_after_backward(options_.strategy); }

Unit* FSDPState::neighbour_in_order(const Unit& unit, int direction) const {
  if (&unit == units_[0].get()) {
    return direction < 0 && !forward_order_.empty() ? forward_order_.back() : nullptr;
  }
  auto it = std::find(forward_order_.begin(), forward_order_.end(), &unit);
  if (it == forward_order_.end()) return nullptr;
  const auto index = (it - forward_order_.begin()) + direction;
  if (index < 0 || index >= static_cast<int64_t>(forward_order_.size())) return nullptr;
  return forward_order_[static_cast<size_t>(index)];
}

void FSDPState::prefetch(Unit* unit) {
  if (!unit || !fsdp_rules::may_prefetch(inflight_gathers_, options_.max_inflight_all_gathers)) return;
  if (unit->start_unshard()) ++inflight_gathers_;
}

namespace {
void consume(Unit& unit, int& inflight) {
  if (unit.unshard_in_flight()) --inflight;
  unit.finish_unshard();
}
}  // namespace

// Note [pipeline steps]
// A pipeline stage (dtrain/pipeline.h) runs several microbatches whose
// forwards and backwards interleave (GPipe: all forwards first), while a
// unit's state follows one forward and then its backward. For such a step
// every unit is gathered once up front; until reduce_step_gradients() the
// root and unit calls run the module plainly on the full parameters (no
// output hooks, no per-unit reshard), and the gradients accumulate at full
// size over the microbatches (the parameters' gradient hooks stand aside).
// reduce_step_gradients() then reduces each unit's gradients once, in unit
// order, reshards and sets the shards' gradients, as the end of one
// backward does. Memory: the stage's parameters and gradients at full size
// for the step; traffic: one gather and one reduction per unit per step,
// however many microbatches.
//
// Per microbatch (gather_for_step(true)): the root is gathered for the step
// as above, but every other unit is gathered when a microbatch's forward
// calls it and resharded after it as reshard_after_forward says, gathered
// again when that microbatch's gradient reaches its output (a hook on it),
// and resharded once its parameters' gradients of that backward have all
// arrived. Memory: the gathered parameters of about one unit at a time
// instead of the stage's; traffic: up to two gathers per unit per
// microbatch (Full) instead of one per step. Gradients still accumulate at
// full size and are reduced once, at the end.
void FSDPState::gather_for_step(bool per_microbatch) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (gathered_for_step_) throw std::logic_error("FSDP: gather_for_step() twice without reduce_step_gradients()");
  for (auto& unit : units_) {
    unit->reshard(free_after_backward());  // parameters changed since the last gather
    unit->reset_to_idle();
    unit->stash_shard_gradients();
  }
  prepare_float8_gathers();  // as forward_root: after the reshards, before any gather
  for (size_t u = 0; u < units_.size(); ++u)
    if (u == 0 || !per_microbatch) units_[u]->start_unshard();  // all issued before any is waited for
  for (size_t u = 0; u < units_.size(); ++u)
    if (u == 0 || !per_microbatch) units_[u]->finish_unshard();
  inflight_gathers_ = 0;
  gathered_for_step_ = true;
  gather_per_microbatch_ = per_microbatch;
  step_arrivals_.assign(units_.size(), 0);
}

torch::Tensor FSDPState::forward_unit_per_microbatch(Unit& unit,
                                                     const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                                                     const torch::Tensor& input) {
  unit.finish_unshard();
  torch::Tensor output = forward(to_compute_dtype(input));
  if (output.defined() && output.requires_grad()) {
    Unit* target = &unit;
    output.register_hook([this, target](const torch::Tensor&) { unshard_for_microbatch_backward(*target); });
  }
  if (reshard_after_forward(unit)) unit.reshard(/*free_full=*/true);
  return output;
}

void FSDPState::unshard_for_microbatch_backward(Unit& unit) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  unit.finish_unshard();
  step_arrivals_[static_cast<size_t>(unit.index())] = 0;
}

void FSDPState::reduce_step_gradients() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (!gathered_for_step_) throw std::logic_error("FSDP: reduce_step_gradients() without gather_for_step()");
  gathered_for_step_ = false;
  gather_per_microbatch_ = false;
  for (auto& unit : units_) {
    if (unit->expected_gradients() == 0) continue;
    bound_inflight_reductions();
    unit->reduce_gradients(/*sync=*/true);
    reduce_order_.push_back(unit.get());
  }
  for (auto& unit : units_) unit->reshard(free_after_backward());
  for (Unit* unit : reduce_order_) unit->finish_gradients();
  reduce_order_.clear();
  reductions_waited_ = 0;
  close_step_stats();
}

torch::Tensor FSDPState::forward_root(const std::function<torch::Tensor()>& forward) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (gathered_for_step_) return forward();  // Note [pipeline steps]
  if (in_root_forward_) throw std::logic_error("FSDP: the root forward was entered twice (recursively)");
  const trace::Span span("unit_forward", trace::category::compute, {{"unit", 0}, {"name", units_[0]->trace_name()}});
  // A new forward: parameters changed since the last gather (optimizer
  // step), so every unit gathers afresh.
  for (auto& unit : units_) {
    unit->reshard(free_after_backward());
    unit->reset_to_idle();
  }
  prepare_float8_gathers();
  inflight_gathers_ = 0;
  prefetching_ = c10::GradMode::is_enabled() ? tuner_.begin_training_forward(*comm_) : tuner_.current();
  in_root_forward_ = true;
  this_forward_.clear();
  failed_in_unit_ = nullptr;
  Unit& root = *units_[0];
  root.begin_forward();
  if (root.start_unshard()) ++inflight_gathers_;
  if (prefetching_ && options_.forward_prefetch && !forward_order_.empty()) prefetch(forward_order_.front());
  consume(root, inflight_gathers_);

  torch::Tensor output;
  try {
    output = forward();
  } catch (const std::exception& error) {
    in_root_forward_ = false;
    std::string skipped;
    for (size_t i = 1; i < units_.size(); ++i) {
      if (std::find(this_forward_.begin(), this_forward_.end(), units_[i].get()) == this_forward_.end()) {
        skipped += (skipped.empty() ? "" : ", ") + units_[i]->display_name();
      }
    }
    // A unit entered through FSDP raised it: its own code failed (a bad
    // input, a kernel's refusal), not a call that went around FSDP. Nor is a
    // broken invariant of the caller's (std::logic_error, e.g. the trainer's
    // refusal of an empty batch) a wrapping problem.
    if (skipped.empty() || failed_in_unit_ != nullptr || dynamic_cast<const std::logic_error*>(&error)) throw;
    throw std::runtime_error("FSDP: the forward failed: " + first_line(error.what()) +
                             "\nThese units were not entered through FSDP in this forward: " + skipped +
                             ". A unit's parameters are full-size only inside its call: hold the module as "
                             "dtrain::Sharded<...> and call it through that holder (or make it a child of the root "
                             "Sequential), or leave it out of the wrap policy.");
  }
  in_root_forward_ = false;
  if (!order_recorded_) {
    forward_order_ = this_forward_;
    order_recorded_ = true;
  }
  const auto output_dtype = options_.mixed_precision.output_dtype;
  if (output.is_floating_point() && output.scalar_type() != output_dtype) output = output.to(output_dtype);
  root.end_forward();
  eager_reductions_ = true;
  if (sync_ && comm_->size() > 1 && output.requires_grad()) {
    auto order = agree_on_reduction_order(*comm_, units_, this_forward_, output);
    eager_reductions_ = order.eager;
    used_anywhere_ = std::move(order.used_anywhere);
  }
  hook_outputs(root, output);
  trace::sample_memory();
  return output;
}

torch::Tensor FSDPState::forward_unit(Unit& unit, const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                                      const torch::Tensor& input) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (gathered_for_step_) {  // Note [pipeline steps]
    if (gather_per_microbatch_) return forward_unit_per_microbatch(unit, forward, input);
    return forward(to_compute_dtype(input));
  }
  if (!in_root_forward_) {
    throw std::runtime_error("FSDP: unit " + unit.display_name() +
                             " was called outside the root's forward. Call the model through the object "
                             "dtrain::fully_shard() returned (fsdp(x)), not model->forward(x).");
  }
  if (unit.state() != TrainingState::Idle) {
    throw std::runtime_error("FSDP: unit " + unit.display_name() +
                             " was called twice in one forward; a unit may run once per forward");
  }
  const trace::Span span("unit_forward", trace::category::compute,
                         {{"unit", unit.index()}, {"name", unit.trace_name()}});
  memory::set_phase("forward of FSDP unit " + unit.display_name());
  unit.begin_forward();
  this_forward_.push_back(&unit);
  if (unit.start_unshard()) ++inflight_gathers_;
  if (prefetching_ && options_.forward_prefetch) prefetch(neighbour_in_order(unit, +1));
  consume(unit, inflight_gathers_);

  const auto unit_input = to_compute_dtype(input);
  const bool checkpoint = options_.activation_checkpointing && torch::GradMode::is_enabled();
  torch::Tensor output;
  try {
    output = checkpoint ? checkpointed_forward(forward, unit_input) : forward(unit_input);
  } catch (...) {
    if (failed_in_unit_ == nullptr) failed_in_unit_ = &unit;  // the innermost unit sees it first
    throw;
  }
  unit.end_forward();
  hook_outputs(unit, output);
  if (reshard_after_forward(unit)) unit.reshard(/*free_full=*/true);
  trace::sample_memory();
  return output;
}

void FSDPState::hook_outputs(Unit& unit, const torch::Tensor& output) {
  if (!output.defined() || !output.requires_grad()) return;
  Unit* target = &unit;
  output.register_hook([this, target](const torch::Tensor&) { pre_backward(*target); });
}

void FSDPState::pre_backward(Unit& unit) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (!finalize_queued_) {
    finalize_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize_backward(); });
  }
  if (unit.state() == TrainingState::PreBackward) return;  // another output of the same unit
  if (unit.state() != TrainingState::ForwardDone) {
    throw std::runtime_error("FSDP: unit " + unit.display_name() + " entered backward while " +
                             to_string(unit.state()) +
                             "; a second backward through one forward (retain_graph) is not supported");
  }
  memory::set_phase("backward of FSDP unit " + unit.display_name());
  unit.backward_started_ns = trace::enabled() ? trace::now_ns() : -1;
  unit.stash_shard_gradients();
  if (unit.start_unshard()) ++inflight_gathers_;
  if (prefetching_ && options_.backward_prefetch == BackwardPrefetch::Pre) prefetch(neighbour_in_order(unit, -1));
  consume(unit, inflight_gathers_);
  unit.begin_backward();
}

void FSDPState::on_gradient_ready(Unit& unit, size_t parameter) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (gathered_for_step_) {  // Note [pipeline steps]: reduced once at the step's end
    const auto u = static_cast<size_t>(unit.index());
    if (gather_per_microbatch_ && u != 0 && ++step_arrivals_[u] == unit.expected_gradients()) {
      step_arrivals_[u] = 0;
      unit.reshard(free_after_backward());
    }
    return;
  }
  if (!unit.on_gradient_ready(parameter)) return;
  // Ranks whose graphs differ keep the gradients until the end of backward.
  const bool reduce_now = sync_ && eager_reductions_;
  if (reduce_now) bound_inflight_reductions();
  unit.reduce_gradients(reduce_now);
  if (reduce_now) reduce_order_.push_back(&unit);
  unit.end_backward();
  unit.reshard(free_after_backward());
  if (prefetching_ && options_.backward_prefetch == BackwardPrefetch::Post) prefetch(neighbour_in_order(unit, -1));
  end_backward_span(unit);
}

void FSDPState::end_backward_span(Unit& unit) {
  if (unit.backward_started_ns < 0) return;
  trace::complete("unit_backward", trace::category::compute, unit.backward_started_ns,
                  {{"unit", unit.index()}, {"name", unit.trace_name()}});
  unit.backward_started_ns = -1;
  trace::sample_memory();
}

void FSDPState::bound_inflight_reductions() {
  while (fsdp_rules::must_wait_for_reduction(options_.strategy, reduce_order_.size() - reductions_waited_,
                                             options_.max_inflight_reductions)) {
    reduce_order_[reductions_waited_++]->wait_reduction();
  }
}

void FSDPState::finalize_backward() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  finalize_queued_ = false;
  struct ResetOnExit {
    FSDPState* self;
    ~ResetOnExit() {
      self->reduce_order_.clear();
      self->reductions_waited_ = 0;
      self->inflight_gathers_ = 0;
      self->eager_reductions_ = true;
      for (auto& unit : self->units_) unit->reset_to_idle();
    }
  } reset{this};

  if (sync_ && !eager_reductions_) {
    reduce_in_unit_order();
    return;
  }
  // Units whose parameters did not all receive gradients (unused in the
  // loss) reduce what they have, in unit order (the same on every rank).
  for (auto& unit : units_) {
    if (unit->state() == TrainingState::PreBackward && unit->expected_gradients() > 0) {
      if (sync_) bound_inflight_reductions();
      unit->reduce_gradients(sync_);
      if (sync_) reduce_order_.push_back(unit.get());
      end_backward_span(*unit);
    }
  }
  for (auto& unit : units_) unit->reshard(free_after_backward());
  for (Unit* unit : reduce_order_) unit->finish_gradients();
  if (sync_) close_step_stats();
}

void FSDPState::prepare_float8_gathers() {
  if (!options_.float8_all_gather) return;
  const Float8Settings* settings = float8_settings();
  if (settings == nullptr || settings->scaling != Float8Scaling::Tensorwise) {
    // Settings removed (a library caller's scope ended): gather as without,
    // and learn again should tensorwise settings come back.
    if (float8_decided_)
      for (auto& unit : units_) unit->gather_as_float8({});
    float8_decided_ = false;
    return;
  }
  torch::NoGradGuard no_grad;
  // Where the shards live (a pipeline stage's root may hold no parameters).
  const auto with_shard = std::find_if(units_.begin(), units_.end(),
                                       [](const auto& unit) { return unit->flat().shard().defined(); });
  if (with_shard == units_.end()) return;
  const auto device = (*with_shard)->flat().shard().device();
  if (!float8_decided_) {
    if (last_step().steps < 1) return;  // the first step shows which weights dtrain::linear takes
    // Every rank decides alike, or the records' sizes would differ: the
    // weights every rank saw taken.
    std::vector<std::vector<char>> candidates;
    std::vector<int32_t> mask;
    for (const auto& unit : units_) {
      candidates.push_back(unit->float8_candidates());
      mask.insert(mask.end(), candidates.back().begin(), candidates.back().end());
    }
    auto agreed = torch::tensor(mask, torch::kInt).to(device);
    if (agreed.numel() > 0) comm_->blocking().all_reduce(agreed, ReduceOp::Min);
    agreed = agreed.cpu();
    int64_t at = 0;
    for (size_t u = 0; u < units_.size(); ++u) {
      for (auto& taken : candidates[u]) taken = agreed[at++].item<int32_t>() != 0 ? 1 : 0;
      units_[u]->gather_as_float8(candidates[u]);
    }
    float8_decided_ = true;
  }
  // One all-reduce of every unit's amax (the optimizer step changed them).
  std::vector<torch::Tensor> amax;
  std::vector<int64_t> counts;
  for (const auto& unit : units_) {
    auto local = unit->float8_local_amax();
    counts.push_back(local.defined() ? local.numel() : 0);
    if (local.defined()) amax.push_back(local);
  }
  if (amax.empty()) return;
  auto all = torch::cat(amax);
  comm_->blocking().all_reduce(all, ReduceOp::Max);
  int64_t at = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (counts[u] == 0) continue;
    units_[u]->set_float8_amax(all.narrow(0, at, counts[u]));
    at += counts[u];
  }
}

void FSDPState::close_step_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  running_step_.steps = last_step_.steps + 1;
  last_step_ = running_step_;
  running_step_ = FSDPStepStats{};
}

void FSDPState::reduce_in_unit_order() {
  // Called from finalize_backward, which resets the step's state on exit.
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = *units_[u];
    if (unit.expected_gradients() == 0 || u >= used_anywhere_.size() || !used_anywhere_[u]) continue;
    const auto state = unit.state();
    // A unit whose backward never ran here: its shard-shaped gradients from
    // earlier (no_sync) micro-batches are set aside as pre_backward does.
    if (state != TrainingState::PreBackward && state != TrainingState::PostBackward) unit.stash_shard_gradients();
    bound_inflight_reductions();
    unit.reduce_gradients(/*sync=*/true);
    reduce_order_.push_back(&unit);
    end_backward_span(unit);
  }
  for (auto& unit : units_) unit->reshard(free_after_backward());
  for (Unit* unit : reduce_order_) unit->finish_gradients();
  close_step_stats();
  eager_reductions_ = true;
}

}  // namespace dtrain::detail
