// --schedule interleaved: a pipeline rank's model chunks (its virtual
// stages), built by the spec's pipeline_stage hook once each and merged
// into one model by name (include/dtrain/model_spec.h, pipeline_place).
#include "train/pipeline_chunks.h"

#include <dtrain/deferred_init.h>
#include <dtrain/mesh.h>

#include <ATen/CPUGeneratorImpl.h>

#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>

namespace dtrain {
namespace {

// The place a chunk's build asks for; unset outside build_chunks (this thread).
thread_local std::optional<PipelinePlace> building;

// Names the place for the chunk built in its lifetime.
struct BuildingChunk {
  explicit BuildingChunk(PipelinePlace place) { building = place; }
  ~BuildingChunk() { building.reset(); }
  BuildingChunk(const BuildingChunk&) = delete;
  BuildingChunk& operator=(const BuildingChunk&) = delete;
};

}  // namespace

PipelinePlace pipeline_place(const DeviceMesh& mesh) {
  if (building) return *building;
  return {mesh.rank("pp"), mesh.size("pp")};
}

namespace train {
namespace {

[[noreturn]] void refuse(const ModelSpec& spec, const std::string& what) {
  throw std::invalid_argument("the model spec '" + spec.name + "' under --schedule interleaved: " + what +
                              " (each call of ModelSpec::pipeline_stage must build the stage "
                              "dtrain::pipeline_place(mesh) names, with the whole model's names)");
}

// The rank's chunks as one module: their children, parameters and buffers
// under their own names (containers several chunks hold, as "blocks", are
// merged into one), so that checkpoints, the engines' units and the
// tensor-parallel slices see the names of the whole model. Initialises a
// deferred module through the chunk that built it, with this model's seed
// (all chunks drew the same one, Note [chunk weights]).
class ChunksImpl : public torch::nn::Module, public DeferredInit {
 public:
  ChunksImpl(const std::vector<std::shared_ptr<torch::nn::Module>>& chunks, const ModelSpec& spec)
      : torch::nn::Module("PipelineChunks"), chunks_(chunks) {
    auto* first = dynamic_cast<DeferredInit*>(chunks.front().get());
    for (const auto& chunk : chunks) {
      auto* owner = dynamic_cast<DeferredInit*>(chunk.get());
      if ((owner == nullptr) != (first == nullptr))
        refuse(spec, "some of its chunks derive from dtrain::DeferredInit and some do not");
      if (owner && owner->init_seed() != first->init_seed())
        refuse(spec, "its chunks drew different init seeds (they must draw from LibTorch's default generator "
                     "only, as the whole model does)");
      for (const auto& item : chunk->named_modules("", /*include_self=*/false)) owners_[item.key()] = owner;
    }
    if (first) set_init_seed(first->init_seed());
    for (const auto& chunk : chunks) merge(*this, *chunk, "", spec);
  }

  // Only a chunk's own modules hold tensors (merge() refuses them on the
  // root and on the containers it merges), so each has one chunk to ask.
  void init_module(const std::string& name, torch::nn::Module& module, at::Generator& generator) override {
    const auto owner = owners_.find(name);
    if (owner == owners_.end() || owner->second == nullptr)
      throw std::invalid_argument("module '" + name + "' (" + module.name() +
                                  ") of a pipeline chunk was built deferred, but the chunk's model does not derive "
                                  "from dtrain::DeferredInit, so nothing can initialise it: follow the contract in "
                                  "dtrain/deferred_init.h");
    owner->second->init_module(name, module, generator);
  }

  // A chunk's own forward may read its training flag.
  void train(bool on) override {
    torch::nn::Module::train(on);
    for (const auto& chunk : chunks_) chunk->train(on);
  }

 private:
  static bool holds_tensors(const torch::nn::Module& module) {
    return !module.named_parameters(/*recurse=*/false).is_empty() || !module.named_buffers(/*recurse=*/false).is_empty();
  }

  // Registers `source`'s parameters, buffers and children in `target`
  // under the same names; a child both hold is merged into a new container
  // the first time, so no chunk's own modules change. Tensors on the root or
  // on a module two chunks hold are refused: no one chunk would initialise
  // them (and a chunk's forward would not see the other's).
  void merge(torch::nn::Module& target, torch::nn::Module& source, const std::string& prefix, const ModelSpec& spec) {
    if (&target == this && holds_tensors(source))
      refuse(spec, "a chunk holds parameters or buffers directly on its root module; hold them in a submodule");
    for (const auto& item : source.named_parameters(/*recurse=*/false))
      target.register_parameter(item.key(), item.value(), item.value().requires_grad());
    for (const auto& item : source.named_buffers(/*recurse=*/false)) target.register_buffer(item.key(), item.value());
    for (const auto& item : source.named_children()) {
      const auto held = target.named_children();
      if (!held.contains(item.key())) {
        target.register_module(item.key(), item.value());
        continue;
      }
      std::shared_ptr<torch::nn::Module> existing = held[item.key()];
      if (holds_tensors(*existing) || holds_tensors(*item.value()))
        refuse(spec, "two chunks hold the module '" + prefix + item.key() + "' and its parameters or buffers");
      if (!containers_.count(existing.get())) {
        // The first holder's module stays as it is: a container of its own takes both.
        auto container = std::make_shared<torch::nn::Module>(existing->name());
        containers_.insert(container.get());
        merge(*container, *existing, prefix + item.key() + ".", spec);
        target.replace_module(item.key(), container);
        existing = container;
      }
      merge(*existing, *item.value(), prefix + item.key() + ".", spec);
    }
  }

  std::vector<std::shared_ptr<torch::nn::Module>> chunks_;
  std::map<std::string, DeferredInit*> owners_;  // a module's name -> the chunk that built it (nullptr: no DeferredInit)
  std::set<const torch::nn::Module*> containers_;  // the merged containers this model made
};

}  // namespace

// Note [chunk weights]
// A chunk draws its init seed from LibTorch's default generator when it is
// built (dtrain/deferred_init.h), as the whole model would. Each chunk is
// built from the generator's state at the start, so every chunk, and this
// merged model, hold the seed the whole model built after the same
// torch::manual_seed would: its weights, whichever rank holds a block.
PipelineChunks build_chunks(const TrainConfig& config, const DeviceMesh& mesh, const ModelSpec& spec) {
  const int rank = mesh.rank("pp"), P = mesh.size("pp"), v = config.virtual_stages;
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  torch::Tensor start;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    start = generator.get_state();
  }
  std::vector<BuiltModel> chunks;
  for (int k = 0; k < v; ++k) {
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(start);
    }
    {
      const BuildingChunk place({rank + k * P, P * v});
      chunks.push_back(spec.pipeline_stage(config, mesh));
    }
    if (!chunks.back().module || !chunks.back().forward)
      refuse(spec, "chunk " + std::to_string(k) + " came without its module or forward");
  }
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  for (const auto& chunk : chunks) modules.push_back(chunk.module);

  PipelineChunks result;
  BuiltModel& merged = result.model;
  merged = chunks.front();  // the loss, logits, groups, shapes and whole model are every chunk's
  merged.module = std::make_shared<ChunksImpl>(modules, spec);
  // The tied weight's copies and the parameters the tp slices name, of all chunks.
  merged.tied_copy.clear();
  merged.tp_split_names.clear();
  for (const auto& chunk : chunks) {
    if (!chunk.tied_copy.empty()) merged.tied_copy = chunk.tied_copy;
    merged.tp_split_names.insert(merged.tp_split_names.end(), chunk.tp_split_names.begin(), chunk.tp_split_names.end());
  }
  auto selected = std::make_shared<int>(0);
  std::vector<std::function<torch::Tensor(const torch::Tensor&)>> forwards;
  for (const auto& chunk : chunks) forwards.push_back(chunk.forward);
  merged.forward = [selected, forwards](const torch::Tensor& x) { return forwards.at(static_cast<size_t>(*selected))(x); };
  result.select = [selected, v](int chunk) {
    if (chunk < 0 || chunk >= v)
      throw std::logic_error("internal error: chunk " + std::to_string(chunk) + " of " + std::to_string(v));
    *selected = chunk;
  };
  return result;
}

}  // namespace train
}  // namespace dtrain
