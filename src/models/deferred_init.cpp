// Deferred construction and per-module initialisation (include/dtrain/deferred_init.h).
#include "dtrain/deferred_init.h"

#include "common/tensor_alias.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/utils.h>

#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>

namespace dtrain {
namespace {

thread_local bool t_constructing_deferred = false;

// splitmix64: spreads nearby inputs over the whole 64-bit range.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) hash = (hash ^ c) * 0x100000001b3ULL;
  return hash;
}

bool has_direct_tensors(const torch::nn::Module& module) {
  return !module.named_parameters(/*recurse=*/false).is_empty() || !module.named_buffers(/*recurse=*/false).is_empty();
}

bool has_deferred_direct_tensors(const torch::nn::Module& module) {
  for (const auto& item : module.named_parameters(false))
    if (is_deferred(item.value())) return true;
  for (const auto& item : module.named_buffers(false))
    if (is_deferred(item.value())) return true;
  return false;
}

// Kaiming-uniform with a = sqrt(5), LibTorch's Linear and Conv weights:
// bound = 1 / sqrt(fan_in); their bias shares the bound.
void init_like_linear(torch::Tensor& weight, torch::Tensor& bias, at::Generator& generator) {
  const int64_t fan_in = weight.dim() > 1 ? weight.numel() / weight.size(0) : weight.numel();
  const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  weight.uniform_(-bound, bound, generator);
  if (bias.defined()) bias.uniform_(-bound, bound, generator);
}

template <class Norm>
bool init_norm(torch::nn::Module& module) {
  auto* norm = module.as<Norm>();
  if (!norm) return false;
  if (norm->weight.defined()) norm->weight.fill_(1.0);
  if (norm->bias.defined()) norm->bias.zero_();
  return true;
}

template <class BatchNorm>
bool init_batch_norm(torch::nn::Module& module) {
  auto* norm = module.as<BatchNorm>();
  if (!norm) return false;
  if (norm->weight.defined()) norm->weight.fill_(1.0);
  if (norm->bias.defined()) norm->bias.zero_();
  if (norm->running_mean.defined()) norm->running_mean.zero_();
  if (norm->running_var.defined()) norm->running_var.fill_(1.0);
  if (norm->num_batches_tracked.defined()) norm->num_batches_tracked.zero_();
  return true;
}

template <class Conv>
bool init_conv(torch::nn::Module& module, at::Generator& generator) {
  auto* conv = module.as<Conv>();
  if (!conv) return false;
  init_like_linear(conv->weight, conv->bias, generator);
  return true;
}

// The module itself as "", then every descendant by qualified name (without
// shared_from_this, which a module under construction cannot give).
template <class Visit>
void for_each_module(torch::nn::Module& root, Visit&& visit) {
  visit(std::string(), root);
  for (const auto& item : root.named_modules("", /*include_self=*/false)) visit(item.key(), *item.value());
}

}  // namespace

DeferredConstruction::DeferredConstruction() : previous_(t_constructing_deferred) { t_constructing_deferred = true; }
DeferredConstruction::~DeferredConstruction() { t_constructing_deferred = previous_; }
bool constructing_deferred() { return t_constructing_deferred; }

void defer_storage(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  auto defer = [](torch::Tensor& tensor) {
    tensor.set_data(detail::storageless(tensor.sizes(), tensor.options().requires_grad(false)));
  };
  for (auto& item : module.named_parameters(true)) defer(item.value());
  for (auto& item : module.named_buffers(true)) defer(item.value());
}

bool is_deferred(const torch::Tensor& tensor) {
  return tensor.defined() && tensor.numel() > 0 && tensor.has_storage() && tensor.storage().data() == nullptr;
}

bool has_deferred_storage(const torch::nn::Module& module) {
  for (const auto& item : module.named_parameters(true))
    if (is_deferred(item.value())) return true;
  for (const auto& item : module.named_buffers(true))
    if (is_deferred(item.value())) return true;
  return false;
}

void check_materialized(const torch::Tensor& probe, const char* model) {
  if (!is_deferred(probe)) return;
  throw std::logic_error(std::string(model) +
                         ": the model was built under dtrain::DeferredConstruction and its weights were never "
                         "materialised: wrap it with dtrain::fully_shard (which builds each unit into its shards) or "
                         "call dtrain::materialize(*model) before using it");
}

at::Generator init_generator(uint64_t seed, const std::string& module_name) {
  return at::make_generator<at::CPUGeneratorImpl>(mix(seed ^ mix(fnv1a(module_name))));
}

void default_init(torch::nn::Module& module, at::Generator& generator) {
  torch::NoGradGuard no_grad;
  if (!has_direct_tensors(module)) return;
  if (auto* linear = module.as<torch::nn::Linear>()) {
    init_like_linear(linear->weight, linear->bias, generator);
    return;
  }
  if (auto* embedding = module.as<torch::nn::Embedding>()) {
    embedding->weight.normal_(0.0, 1.0, generator);
    if (auto padding = embedding->options.padding_idx()) embedding->weight[*padding].zero_();
    return;
  }
  if (init_conv<torch::nn::Conv1d>(module, generator) || init_conv<torch::nn::Conv2d>(module, generator) ||
      init_conv<torch::nn::Conv3d>(module, generator) || init_norm<torch::nn::LayerNorm>(module) ||
      init_norm<torch::nn::GroupNorm>(module) || init_batch_norm<torch::nn::BatchNorm1d>(module) ||
      init_batch_norm<torch::nn::BatchNorm2d>(module) || init_batch_norm<torch::nn::BatchNorm3d>(module)) {
    return;
  }
  throw std::invalid_argument("dtrain::default_init: no default initialisation for a " + module.name() +
                              " that owns parameters or buffers; override DeferredInit::init_module for it");
}

DeferredInit::DeferredInit() {
  auto generator = at::detail::getDefaultCPUGenerator();  // a handle to the process's generator
  std::lock_guard<std::mutex> lock(generator.mutex());
  init_seed_ = generator.get<at::CPUGeneratorImpl>()->random64();
}

DeferredInit::~DeferredInit() = default;

void DeferredInit::init_module(const std::string& /*name*/, torch::nn::Module& module, at::Generator& generator) {
  default_init(module, generator);
}

void DeferredInit::initialize_unless_deferred(torch::nn::Module& self) {
  if (constructing_deferred()) return;
  torch::NoGradGuard no_grad;
  for_each_module(self, [this](const std::string& name, torch::nn::Module& module) {
    if (!has_direct_tensors(module)) return;
    auto generator = init_generator(init_seed_, name);
    init_module(name, module, generator);
  });
}

namespace detail {

std::vector<DeferredInit*> deferred_init_models(torch::nn::Module& root) {
  std::vector<DeferredInit*> models;
  for_each_module(root, [&](const std::string&, torch::nn::Module& module) {
    if (auto* model = dynamic_cast<DeferredInit*>(&module)) models.push_back(model);
  });
  return models;
}

std::vector<DeferredModule> deferred_modules(torch::nn::Module& root) {
  // The innermost DeferredInit model above each module: the longest name
  // prefix that is one (named_modules lists parents before children).
  std::map<std::string, DeferredInit*> owners;
  std::vector<DeferredModule> result;
  for_each_module(root, [&](const std::string& name, torch::nn::Module& module) {
    if (auto* model = dynamic_cast<DeferredInit*>(&module)) owners[name] = model;
    if (!has_deferred_direct_tensors(module)) return;
    DeferredModule entry{name, &module, nullptr, ""};
    size_t longest = 0;
    for (const auto& [prefix, model] : owners) {
      const bool contains = prefix.empty() || name == prefix || name.rfind(prefix + ".", 0) == 0;
      if (!contains || (entry.owner && prefix.size() < longest)) continue;
      longest = prefix.size();
      entry.owner = model;
      entry.name_in_owner = prefix.empty() ? name : (name == prefix ? "" : name.substr(prefix.size() + 1));
    }
    if (!entry.owner) {
      throw std::invalid_argument("module '" + name + "' (" + module.name() +
                                  ") was built deferred, but no model containing it derives from dtrain::DeferredInit, "
                                  "so nothing can initialise it: follow the contract in dtrain/deferred_init.h or "
                                  "build it outside a DeferredConstruction scope");
    }
    result.push_back(std::move(entry));
  });
  return result;
}

void materialize_module(const DeferredModule& deferred) {
  torch::NoGradGuard no_grad;
  auto& module = *deferred.module;
  for (auto& item : module.named_parameters(false)) {
    if (is_deferred(item.value())) item.value().set_data(torch::empty(item.value().sizes(), item.value().options()));
  }
  for (auto& item : module.named_buffers(false)) {
    if (is_deferred(item.value())) item.value().set_data(torch::empty(item.value().sizes(), item.value().options()));
  }
  auto generator = init_generator(deferred.owner->init_seed(), deferred.name_in_owner);
  deferred.owner->init_module(deferred.name_in_owner, module, generator);
}

}  // namespace detail

void materialize(torch::nn::Module& root) {
  for (const auto& module : detail::deferred_modules(root)) detail::materialize_module(module);
}

}  // namespace dtrain
