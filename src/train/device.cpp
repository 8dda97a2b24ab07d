#include "train/device.h"

#include "dtrain/strategy_table.h"
#include "dtrain/train.h"
#include "train/cuda_runtime.h"
#include "comm/env.h"

#include <ATen/Context.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dtrain::train {
namespace {

int local_rank() {
  for (const char* name : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"})
    if (const auto value = env_int(name, 0, 1 << 20)) return *value;
  return 0;
}

bool cpu_only_strategy(const TrainConfig& config) {
  return strategy_info(config.strategy).engine == StrategyEngine::ParameterServer;
}

}  // namespace

torch::Device resolve_device(const TrainConfig& config) {
  const int gpus = cuda::device_count();
  if (config.device == "cpu" || (config.device == "auto" && (gpus == 0 || cpu_only_strategy(config))))
    return torch::kCPU;
  if (config.device != "cuda" && config.device != "auto")
    throw std::invalid_argument("--device '" + config.device + "' is not one of cpu, cuda, auto");
  if (gpus == 0)
    throw std::invalid_argument("--device cuda: this machine has no GPU this dtrain build can use (LibTorch sees "
                                "0 CUDA devices); use --device cpu, or --device auto to take a GPU only when "
                                "there is one");
  if (cpu_only_strategy(config))
    throw std::invalid_argument("--device cuda: --strategy " + config.strategy +
                                " trains on the CPU (the parameter server moves host tensors); use --device cpu");
  if (config.pp > 1)
    throw std::invalid_argument("--device " + config.device + ": --pp on a GPU is not available yet (the stages "
                                "exchange host tensors); use --device cpu with --pp");
  return {torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank() % gpus)};
}

int devices_in_job(const torch::Device& device, int world_size) {
  if (!device.is_cuda()) return world_size;
  const int per_node = env_int("LOCAL_WORLD_SIZE", 1, 1 << 20).value_or(world_size);
  const int nodes = std::max(1, world_size / per_node);
  return nodes * std::min(per_node, cuda::device_count());
}

void prepare_device(const TrainConfig& config, const torch::Device& device) {
  if (!device.is_cuda()) return;
  cuda::set_device(device.index());
  // TF32 for fp32 matmuls and convolutions: what the tensor cores run at
  // full speed; off keeps fp32 products exact to fp32.
  at::globalContext().setAllowTF32CuBLAS(config.tf32);
  at::globalContext().setAllowTF32CuDNN(config.tf32);
}

std::string describe_device(const torch::Device& device) {
  if (!device.is_cuda()) return "cpu";
  return device.str() + " (" + cuda::device_name(device.index()) + ")";
}

data::Batch batch_on(const data::Batch& batch, const torch::Device& device) {
  if (batch.inputs.device() == device) return batch;
  data::Batch moved = batch;
  const bool pin = device.is_cuda();
  const auto move = [&](const torch::Tensor& t) {
    if (!t.defined()) return t;
    return (pin ? t.pin_memory() : t).to(device, /*non_blocking=*/pin);
  };
  moved.inputs = move(batch.inputs);
  moved.targets = move(batch.targets);
  return moved;
}

}  // namespace dtrain::train
