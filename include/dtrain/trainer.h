// dtrain::Trainer: a whole training run of any model, with every feature of
// `dtrain train` (strategies and meshes, checkpoints that resume and reshard,
// --max-restarts and elastic resizes under dtrain launch, asynchronous
// checkpoints, SIGINT/SIGTERM saves, the non-finite rule, evaluation,
// progress with MFU, the metrics file, traces, --balance).
//
//   dtrain::ModelSpec spec;                       // dtrain/model_spec.h
//   spec.build = [](const dtrain::TrainConfig&) { return dtrain::built_model(MyNet()); };
//   spec.data = [](const dtrain::TrainConfig&) { return dtrain::ModelData{train, validation}; };
//   auto world = dtrain::init(argc, argv);
//   dtrain::TrainConfig config;                   // strategy, steps, optimizer, ... (dtrain/train.h)
//   config.strategy = "fsdp";
//   auto result = dtrain::Trainer(config, spec).run(world);   // every rank calls it
//
// run_training(config, world) is Trainer(config).run(world). To get the
// command line too (dtrain train, launch, plan, checkpoint with --model
// yours), register the spec and call dtrain::cli::main (dtrain/cli.h).
#pragma once

#include <dtrain/comm.h>
#include <dtrain/model_spec.h>
#include <dtrain/train.h>

#include <memory>
#include <optional>

namespace dtrain {

class Trainer {
 public:
  // Trains the registered model config.model names.
  explicit Trainer(TrainConfig config);
  // Trains `spec`, named spec.name (required; not a built-in's name). run()
  // registers it under that name (replacing what the program registered
  // there) and config.model names it.
  Trainer(TrainConfig config, ModelSpec spec);

  const TrainConfig& config() const { return config_; }

  // Runs on this rank of `world`; every rank calls it with the same config.
  // Throws std::invalid_argument for a config it cannot run (naming the flag),
  // std::runtime_error for data that cannot be read.
  TrainResult run(CommPtr world) const;

 private:
  TrainConfig config_;
  std::shared_ptr<const ModelSpec> spec_;  // the spec passed in; none: config.model's registered one
};

}  // namespace dtrain
