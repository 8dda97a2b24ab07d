// How optimizer state is named inside a checkpoint: "optim/PARAM/KEY", with
// the keys each optimizer kind keeps. Torch-free, so the manifest's
// validation can check names without LibTorch's optimizer headers.
#pragma once

#include <string>
#include <vector>

namespace dtrain::detail {

inline const char* const kOptimizerStatePrefix = "optim/";

// "optim/PARAM/KEY"
inline std::string optimizer_state_name(const std::string& parameter, const std::string& key) {
  return kOptimizerStatePrefix + parameter + "/" + key;
}

// Keys the state of `kind` ("adamw", "adam", "sgd", "none") may have; empty
// for "none" and for kinds no saver writes.
inline std::vector<std::string> optimizer_state_keys(const std::string& kind) {
  if (kind == "adamw" || kind == "adam") return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"};
  if (kind == "sgd") return {"momentum_buffer"};
  return {};
}

// Whether a saver writes optimizer state of this kind ("none": no state).
inline bool known_optimizer_kind(const std::string& kind) {
  return kind == "none" || kind == "adamw" || kind == "adam" || kind == "sgd";
}

}  // namespace dtrain::detail
