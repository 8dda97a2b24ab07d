#include "ddp/compute_copies.h"
#include "ddp/reducer.h"
#include "comm/replicas.h"

#include <dtrain/ddp.h>
#include <dtrain/deferred_init.h>

#include <c10/core/GradMode.h>

#include <stdexcept>

namespace dtrain {
namespace {

void check_options(const DDPOptions& options) {
  if (options.bucket_cap_bytes <= 0 || options.first_bucket_cap_bytes <= 0) {
    throw std::invalid_argument("DDP: bucket_cap_bytes and first_bucket_cap_bytes must be positive (got " +
                                std::to_string(options.bucket_cap_bytes) + " and " +
                                std::to_string(options.first_bucket_cap_bytes) + ")");
  }
}

}  // namespace

DistributedDataParallelBase::DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module, CommPtr comm,
                                                         DDPOptions options)
    : module_(std::move(module)), comm_(std::move(comm)), options_(std::move(options)) {
  if (!module_) throw std::invalid_argument("DDP: the module is null");
  if (!comm_) throw std::invalid_argument("DDP: the communicator is null; pass the one dtrain::init() returned");
  check_options(options_);

  std::vector<detail::NamedTensor> everything;
  std::vector<torch::Tensor> values;
  std::vector<std::string> trained_names;
  std::vector<torch::Tensor> trained;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    everything.push_back({"parameter", item.key(), item.value()});
    values.push_back(item.value());
    if (item.value().requires_grad()) {
      trained_names.push_back(item.key());
      trained.push_back(item.value());
    }
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    everything.push_back({"buffer", item.key(), item.value()});
    values.push_back(item.value());
  }
  for (size_t i = 0; i < trained.size(); ++i) {
    if (trained[i].layout() != torch::kStrided) {
      throw std::invalid_argument("DDP: parameter '" + trained_names[i] + "' is not a dense tensor");
    }
  }

  detail::check_same_on_all_ranks(*comm_, everything, "DDP");
  // A replica needs the whole model: a deferred one is built here in full.
  if (has_deferred_storage(*module_)) materialize(*module_);
  detail::broadcast_from_rank0(*comm_, values);
  if (options_.mixed_precision) {
    compute_copies_ = std::make_unique<detail::ComputeCopies>(module_->parameters(/*recurse=*/true),
                                                              options_.mixed_precision->param_dtype);
  }
  reducer_ = std::make_unique<detail::Reducer>(std::move(trained_names), std::move(trained), comm_, options_,
                                               compute_copies_.get());
}

DistributedDataParallelBase::~DistributedDataParallelBase() = default;
DistributedDataParallelBase::DistributedDataParallelBase(DistributedDataParallelBase&&) noexcept = default;
DistributedDataParallelBase& DistributedDataParallelBase::operator=(DistributedDataParallelBase&&) noexcept = default;

void DistributedDataParallelBase::before_forward() {
  if (options_.broadcast_buffers && comm_->size() > 1) {
    std::vector<torch::Tensor> buffers = module_->buffers(/*recurse=*/true);
    detail::broadcast_from_rank0(*comm_, buffers);
  }
  if (compute_copies_) compute_copies_->swap_in();
}

torch::Tensor DistributedDataParallelBase::compute_input(const torch::Tensor& input) const {
  if (!compute_copies_ || !input.defined() || !input.is_floating_point()) return input;
  return input.to(compute_copies_->dtype());
}

torch::Tensor DistributedDataParallelBase::finish_forward(const torch::Tensor& output) {
  if (!compute_copies_) return output;
  if (!c10::GradMode::is_enabled()) compute_copies_->swap_out();
  const auto dtype = options_.mixed_precision->output_dtype;
  if (!output.defined() || !output.is_floating_point() || output.scalar_type() == dtype) return output;
  return output.to(dtype);
}

DistributedDataParallelBase::NoSyncGuard::NoSyncGuard(DistributedDataParallelBase& ddp)
    : ddp_(ddp), previous_(ddp.reducer_->sync()) {
  ddp_.reducer_->set_sync(false);
}

DistributedDataParallelBase::NoSyncGuard::~NoSyncGuard() { ddp_.reducer_->set_sync(previous_); }

std::vector<torch::Tensor> DistributedDataParallelBase::parameters() const { return module_->parameters(); }

DDPStepStats DistributedDataParallelBase::last_step() const { return reducer_->last_step(); }

std::vector<std::vector<std::string>> DistributedDataParallelBase::bucket_layout() const {
  return reducer_->bucket_layout();
}

}  // namespace dtrain
