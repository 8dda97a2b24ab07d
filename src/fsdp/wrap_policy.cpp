#include "fsdp/wrap_policy.h"

#include <torch/nn/modules/container/sequential.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>

namespace dtrain::detail {
namespace {

std::mutex g_declared_mutex;
std::vector<std::weak_ptr<torch::nn::Module>>& declared_modules() {
  static std::vector<std::weak_ptr<torch::nn::Module>> modules;
  return modules;
}

std::string short_type_name(const std::string& name) {
  const auto colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

bool chosen(const std::string& name, const torch::nn::Module& module, bool child_of_sequential_root,
            const WrapPolicy& policy) {
  if (policy.declared && (is_declared_unit(&module) || child_of_sequential_root)) return true;
  for (const auto& type : policy.module_types) {
    if (type == module.name() || type == short_type_name(module.name())) return true;
  }
  if (std::find(policy.module_names.begin(), policy.module_names.end(), name) != policy.module_names.end()) return true;
  if (policy.min_parameters > 0) {
    int64_t count = 0;
    for (const auto& p : module.parameters()) count += p.numel();
    if (count >= policy.min_parameters) return true;
  }
  return false;
}

}  // namespace

void declare_unit(const std::shared_ptr<torch::nn::Module>& module) {
  std::lock_guard<std::mutex> lock(g_declared_mutex);
  auto& modules = declared_modules();
  std::erase_if(modules, [](const auto& weak) { return weak.expired(); });
  modules.push_back(module);
}

bool is_declared_unit(const torch::nn::Module* module) {
  std::lock_guard<std::mutex> lock(g_declared_mutex);
  for (const auto& weak : declared_modules()) {
    auto alive = weak.lock();
    if (alive && alive.get() == module) return true;
  }
  return false;
}

std::vector<UnitPlan> plan_units(const std::shared_ptr<torch::nn::Module>& root, const WrapPolicy& policy) {
  const bool sequential_root = root->as<torch::nn::SequentialImpl>() != nullptr;
  std::vector<UnitPlan> units(1);
  units[0].module = root;
  for (const auto& item : root->named_modules("", /*include_self=*/false)) {
    const bool direct_child = item.key().find('.') == std::string::npos;
    if (chosen(item.key(), *item.value(), sequential_root && direct_child, policy)) {
      units.push_back(UnitPlan{item.key(), item.value(), {}, {}});
    }
  }

  // Innermost unit first: longer names are deeper in the module tree.
  std::vector<size_t> by_depth(units.size() - 1);
  for (size_t i = 0; i < by_depth.size(); ++i) by_depth[i] = i + 1;
  std::stable_sort(by_depth.begin(), by_depth.end(),
                   [&](size_t a, size_t b) { return units[a].name.size() > units[b].name.size(); });
  std::map<const void*, size_t> owner;  // TensorImpl -> unit
  for (size_t u : by_depth) {
    for (const auto& item : units[u].module->named_parameters(/*recurse=*/true)) {
      owner.try_emplace(item.value().unsafeGetTensorImpl(), u);
    }
  }
  std::set<const void*> seen;
  for (const auto& item : root->named_parameters(/*recurse=*/true)) {
    const void* impl = item.value().unsafeGetTensorImpl();
    if (!seen.insert(impl).second) {
      throw std::invalid_argument("FSDP: parameter '" + item.key() +
                                  "' is the same tensor as another registered parameter; shared parameters are not "
                                  "supported (tie weights by reusing one module instead)");
    }
    auto it = owner.find(impl);
    auto& unit = units[it == owner.end() ? 0 : it->second];
    unit.parameter_names.push_back(item.key());
    unit.parameters.push_back(item.value());
  }
  std::vector<UnitPlan> kept;
  for (size_t i = 0; i < units.size(); ++i) {
    if (i == 0 || !units[i].parameters.empty()) kept.push_back(std::move(units[i]));
  }
  return kept;
}

}  // namespace dtrain::detail
