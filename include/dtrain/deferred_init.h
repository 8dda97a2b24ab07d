// Deferred construction: build a model without the memory of its weights,
// then give each piece its storage and initial values only where and when
// it is needed. This is how FSDP trains a model larger than one rank: every
// rank builds the model deferred, and dtrain::fully_shard materialises one
// module at a time, keeping only this rank's shard of it.
//
//   torch::manual_seed(seed);
//   models::GPT model{nullptr};
//   {
//     dtrain::DeferredConstruction deferred;   // parameters get no storage
//     model = models::GPT(config);
//   }
//   auto fsdp = dtrain::fully_shard(model, world);  // each unit built straight into its shards
//
// The weights are the same as a plain construction with the same seed,
// whatever the world size and strategy, because initialisation is defined
// per module: a module named N in a model with init seed S is initialised
// from its own generator, seeded from (S, N) (init_generator). The init seed
// is drawn from LibTorch's default generator when the model is built, so
// torch::manual_seed still decides the weights, and fully_shard uses rank
// 0's seed on every rank (as it would broadcast rank 0's weights).
//
// The contract for a model of your own (Note [deferred init contract]):
// 1. derive the root module from dtrain::DeferredInit as well as
//    torch::nn::Module;
// 2. wrap each parameter-holding submodule when you register it:
//      fc_ = register_module("fc", dtrain::deferred(torch::nn::Linear(a, b)));
//    (outside a DeferredConstruction scope this does nothing);
// 3. end the constructor with initialize_unless_deferred(*this);
// 4. override init_module() if a module should not get LibTorch's default
//    initialisation (default_init). It must set only that module's own
//    parameters and buffers and draw random numbers only from `generator`.
// A model that does not follow it still trains: fully_shard builds it the
// old way (every rank holds the whole model until it is sharded).
//
// A deferred parameter is a CPU tensor of its full shape whose storage has
// no bytes; code that reads it before materialisation fails (most kernels
// with LibTorch's "data is not allocated yet"). The built-in models check
// in forward and name the fix.
#pragma once

#include <ATen/core/Generator.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain {

// While one lives on this thread, dtrain::deferred() takes the storage away
// from the modules it is given. Nests.
class DeferredConstruction {
 public:
  DeferredConstruction();
  ~DeferredConstruction();
  DeferredConstruction(const DeferredConstruction&) = delete;
  DeferredConstruction& operator=(const DeferredConstruction&) = delete;

 private:
  bool previous_;
};
bool constructing_deferred();

// Frees the storage of every parameter and buffer of `module` (and its
// children), keeping shapes and dtypes.
void defer_storage(torch::nn::Module& module);

// The module holder itself; inside a DeferredConstruction scope its
// parameters and buffers first lose their storage.
template <class Holder>
Holder deferred(Holder holder) {
  if (constructing_deferred()) defer_storage(*holder.ptr());
  return holder;
}

// True for a tensor with elements but no storage yet.
bool is_deferred(const torch::Tensor& tensor);
// Whether any parameter or buffer of `module` (recursively) is deferred.
bool has_deferred_storage(const torch::nn::Module& module);
// For a model's forward: throws std::logic_error naming `model` and the fix
// when `probe` (one of its parameters) was never materialised.
void check_materialized(const torch::Tensor& probe, const char* model);

// The generator a module named `module_name` is initialised from, in a model
// whose init seed is `seed`.
at::Generator init_generator(uint64_t seed, const std::string& module_name);

// LibTorch's own initialisation of its built-in modules (Linear, Conv1-3d,
// Embedding, LayerNorm, GroupNorm, BatchNorm1-3d), drawing from `generator`.
// Throws std::invalid_argument for another module that owns parameters.
void default_init(torch::nn::Module& module, at::Generator& generator);

// The side of the contract a model implements (see above).
class DeferredInit {
 public:
  // Draws the init seed from LibTorch's default generator.
  DeferredInit();
  virtual ~DeferredInit();

  // Sets the direct parameters and buffers of `module`, named `name` inside
  // this model ("" for the model itself). Default: default_init.
  virtual void init_module(const std::string& name, torch::nn::Module& module, at::Generator& generator);

  uint64_t init_seed() const { return init_seed_; }
  void set_init_seed(uint64_t seed) { init_seed_ = seed; }

 protected:
  // Initialises every module of `self` (the model itself) unless a
  // DeferredConstruction scope is active.
  void initialize_unless_deferred(torch::nn::Module& self);

 private:
  uint64_t init_seed_;
};

// Gives every deferred parameter and buffer of `root` its storage and its
// initial values, module by module (the whole model ends up in memory; DDP
// and single-process training call it on a deferred model). Throws
// std::invalid_argument naming a deferred module that no DeferredInit model
// contains.
void materialize(torch::nn::Module& root);

namespace detail {

// A module with deferred storage and who initialises it.
struct DeferredModule {
  std::string name;  // qualified from the root passed to deferred_modules
  torch::nn::Module* module = nullptr;
  DeferredInit* owner = nullptr;  // the innermost DeferredInit model containing it
  std::string name_in_owner;      // the name init_module is called with
};
// Every module of `root` that has deferred direct parameters or buffers, in
// registration order; throws as materialize() does.
std::vector<DeferredModule> deferred_modules(torch::nn::Module& root);
// Every DeferredInit model inside `root` (itself included), in registration order.
std::vector<DeferredInit*> deferred_init_models(torch::nn::Module& root);
// Allocates the module's deferred direct parameters and buffers (CPU, full
// size) and initialises them through its owner.
void materialize_module(const DeferredModule& module);

}  // namespace detail

}  // namespace dtrain
