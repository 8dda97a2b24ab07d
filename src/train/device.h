// --device: where a rank trains, and moving its data there.
#pragma once

#include "dtrain/data.h"

#include <torch/types.h>

#include <string>

namespace dtrain {
struct TrainConfig;
}

namespace dtrain::train {

// This rank's device for config.device: cpu; cuda:(local rank % GPUs); auto
// = cuda when this build and machine have a GPU (and the strategy runs on
// one), else cpu. The local rank is LOCAL_RANK (dtrain launch, torchrun,
// Slurm), else OpenMPI's OMPI_COMM_WORLD_LOCAL_RANK, else 0. Throws
// std::invalid_argument "--device cuda: ..." naming what is missing.
torch::Device resolve_device(const TrainConfig& config);

// The devices the job's `world_size` ranks compute on, each counted once:
// every rank on the CPU (each has its own cores); on GPUs, each node's
// ranks (LOCAL_WORLD_SIZE) share its GPUs.
int devices_in_job(const torch::Device& device, int world_size);

// Makes `device` this thread's current CUDA device and applies --tf32; no-op on the CPU.
void prepare_device(const TrainConfig& config, const torch::Device& device);

// "cpu" or "cuda:0 (NVIDIA H200)".
std::string describe_device(const torch::Device& device);

// The batch on `device`. To a GPU through pinned host memory with
// non-blocking copies, so the transfer queues behind the compute stream
// instead of stalling the host; on the CPU the batch itself.
data::Batch batch_on(const data::Batch& batch, const torch::Device& device);

}  // namespace dtrain::train
