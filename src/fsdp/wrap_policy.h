// Which modules of a model become FSDP units, and which parameters each owns.
#pragma once

#include <dtrain/fsdp.h>

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

namespace dtrain::detail {

struct UnitPlan {
  std::string name;  // qualified module name, "" for the root
  std::shared_ptr<torch::nn::Module> module;
  std::vector<std::string> parameter_names;  // qualified from the root
  std::vector<torch::Tensor> parameters;
};

// Element 0 is the root unit (every parameter no other unit owns); the rest
// follow module registration order. A parameter belongs to the innermost
// unit containing it. Units without parameters are dropped (except the
// root). Throws when one tensor is registered under two names (shared
// parameters across units are not supported).
std::vector<UnitPlan> plan_units(const std::shared_ptr<torch::nn::Module>& root, const WrapPolicy& policy);

// Registry of modules held by dtrain::Sharded<> (WrapPolicy::declared).
bool is_declared_unit(const torch::nn::Module* module);

}  // namespace dtrain::detail
