// Checkpoints of a parameter-server run (--strategy ps-*): what each rank
// writes and reads (Note [parameter-server checkpoints] in src/ps/server.cpp).
// The servers hold the parameters and the optimizer state, as slices of the
// flat parameter vector; worker 0 writes the buffers (the workers do not
// exchange them), and every worker, when loading, reads the whole model, as
// a DDP replica would. The result is an ordinary sharded checkpoint: it loads into
// any strategy at any world size, and any checkpoint loads into it.
#pragma once

#include "dtrain/checkpoint.h"
#include "dtrain/ps.h"

#include <torch/nn/module.h>

#include <string>

namespace dtrain::train {

enum class HeldFor { Saving, Loading };

// A worker's part. `optimizer` is the servers' optimizer (--optimizer), for
// the manifest: a worker has none.
HeldModel ps_worker_held(torch::nn::Module& module, const ps::Group& group, const std::string& strategy,
                         const std::string& optimizer, HeldFor use);

// A server's part: its slices (and, when loading, every other tensor of the
// model as an empty piece, so that the names are checked against the
// checkpoint's).
HeldModel ps_server_held(torch::nn::Module& module, const ps::Group& group, const ps::Server& server,
                         const std::string& strategy, HeldFor use);

}  // namespace dtrain::train
