// Which parameters of a tensor-parallel model are slices, and where each
// slice sits in the unsplit tensor (tensor_parallel.h): what sharded
// checkpoints need to save on one mesh and load on another.
#include "dtrain/tensor_parallel.h"

namespace dtrain::tp {

std::map<std::string, PlaceInGlobal> parameter_places(const torch::nn::Module& root) {
  std::map<std::string, PlaceInGlobal> places;
  for (const auto& item : root.named_modules()) {
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    const torch::nn::Module& module = *item.value();
    if (const auto* column = module.as<ColumnParallelLinear>()) {
      // Rank r holds the r-th slice of each section's rows: with the output
      // features seen as [sections, out / sections], a slice along dim 1.
      const int64_t out = column->out_features(), in = column->in_features(), sections = column->sections();
      const int n = column->group()->size(), r = column->group()->rank();
      const int64_t rows = out / sections / n;
      places[prefix + "weight"] = {{out, in}, runs_of_slice({sections, out / sections, in}, 1, r * rows, rows)};
      if (column->bias.defined()) {
        places[prefix + "bias"] = {{out}, runs_of_slice({sections, out / sections}, 1, r * rows, rows)};
      }
    } else if (const auto* row = module.as<RowParallelLinear>()) {
      const int64_t out = row->out_features(), in = row->in_features();
      const int n = row->group()->size(), r = row->group()->rank();
      places[prefix + "weight"] = {{out, in}, runs_of_slice({out, in}, 1, r * (in / n), in / n)};  // bias: replicated
    } else if (const auto* embedding = module.as<VocabParallelEmbedding>()) {
      const int64_t vocab = embedding->vocab_size(), dim = embedding->dim();
      const int64_t rows = vocab / embedding->group()->size();
      places[prefix + "weight"] = {{vocab, dim}, runs_of_slice({vocab, dim}, 0, embedding->first_token(), rows)};
    }
  }
  return places;
}

std::vector<std::string> split_parameter_names(const torch::nn::Module& root) {
  std::vector<std::string> names;
  for (const auto& [name, place] : parameter_places(root)) names.push_back(name);
  return names;
}

}  // namespace dtrain::tp
