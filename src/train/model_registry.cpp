// The model registry (include/dtrain/model_spec.h): --model's names and
// their specs.
//
// Note [built-in models are registered lazily]
// dtrain is a static library. A file-scope registrar object in a file that
// nothing else references would be dropped by the linker, and its order
// against another file's static initialisers is unspecified. So the built-in
// specs are registered on the registry's first use (register_builtin_models,
// src/train/builtin_models.cpp), through the same register_model a user calls.
#include "dtrain/model_spec.h"

#include "train/builtin_models.h"

#include <torch/nn/functional/loss.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>

namespace dtrain {
namespace {

// A spec is never changed or destroyed once registered: find_model's
// references stay valid, and a spec in use by a run is not replaced under it
// (a name registered again points at a new spec; the old one is retired).
struct Registry {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<const ModelSpec>> specs;
  std::vector<std::shared_ptr<const ModelSpec>> retired;
  std::vector<std::string> order;  // registration order: the built-ins first
  size_t builtins = 0;             // the first `builtins` names of `order`
};

void add(Registry& registry, const std::string& name, ModelSpec spec) {
  const bool good_name = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
  if (!good_name)
    throw std::invalid_argument("register_model: the name '" + name + "' must be letters, digits, '-', '_' or '.'");
  if (!spec.build) throw std::invalid_argument("register_model: the spec of '" + name + "' has no build function");
  for (size_t i = 0; i < registry.builtins; ++i)
    if (registry.order[i] == name)
      throw std::invalid_argument("register_model: '" + name + "' is a built-in model; give yours another name");
  spec.name = name;
  auto& slot = registry.specs[name];
  if (slot) registry.retired.push_back(std::move(slot));
  else registry.order.push_back(name);
  slot = std::make_shared<const ModelSpec>(std::move(spec));
}

// Held under the mutex by its callers; the built-ins go in on first use.
Registry& registry() {
  static Registry* instance = [] {
    auto* r = new Registry;  // never destroyed: specs may be looked up from other static destructors
    train::register_builtin_models([r](const std::string& name, ModelSpec spec) { add(*r, name, std::move(spec)); });
    r->builtins = r->order.size();
    return r;
  }();
  return *instance;
}

}  // namespace

void register_model(const std::string& name, ModelSpec spec) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  add(r, name, std::move(spec));
}

const ModelSpec& find_model(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto found = r.specs.find(name);
  if (found != r.specs.end()) return *found->second;  // never destroyed (Registry)
  std::string known;
  for (const auto& each : r.order) known += (known.empty() ? "" : ", ") + each;
  throw std::invalid_argument("--model '" + name + "' is not one of: " + known +
                              " (a program registers its own with dtrain::register_model, dtrain/model_spec.h)");
}

bool has_model(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.specs.count(name) != 0;
}

std::vector<std::string> model_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.order;
}

torch::Tensor cross_entropy_per_sample(const torch::Tensor& output, const torch::Tensor& targets) {
  namespace F = torch::nn::functional;
  const auto none = F::CrossEntropyFuncOptions().reduction(torch::kNone);
  if (output.dim() == 2) return F::cross_entropy(output, targets, none);
  const int64_t batch = output.size(0), positions = output.size(1);
  auto per_position = F::cross_entropy(output.reshape({batch * positions, output.size(2)}), targets.reshape(-1), none);
  return per_position.view({batch, positions}).mean(1);
}

}  // namespace dtrain
