#include "fsdp/flat_parameter.h"
#include "fsdp/schedule_rules.h"

#include "common/tensor_alias.h"

#include <c10/core/DeviceGuard.h>

#include <dtrain/comm.h>
#include <dtrain/deferred_init.h>

#include <c10/core/Allocator.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <stdexcept>

namespace dtrain::detail {
namespace {

std::string dtype_name_of(const torch::Tensor& t) { return dtype_name(t.scalar_type()); }

}  // namespace

FlatParameter::FlatParameter(std::vector<std::string> names, std::vector<torch::Tensor> params, int group_size,
                             int group_rank, torch::ScalarType compute_dtype, std::optional<torch::Device> device)
    : compute_dtype_(compute_dtype) {
  if (params.empty()) {
    // A unit without parameters (a root whose children are all units):
    // nothing to gather or reduce.
    full_is_shard_ = true;
    return;
  }
  const auto first = params.front().options().requires_grad(false);
  const auto master = device ? first.device(*device) : first;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].scalar_type() != first.dtype().toScalarType() || params[i].device() != first.device()) {
      throw std::invalid_argument("FSDP: parameter '" + names[i] + "' is " + dtype_name_of(params[i]) +
                                  " but '" + names[0] + "' in the same unit is " + dtype_name_of(params[0]) +
                                  "; a unit's parameters must share dtype and device");
    }
    FlatEntry entry;
    entry.name = names[i];
    entry.param = params[i];
    entry.shape = params[i].sizes().vec();
    entry.offset = numel_;
    entry.numel = params[i].numel();
    numel_ += entry.numel;
    entries_.push_back(std::move(entry));
  }
  const auto sizes = fsdp_rules::flat_sizes(numel_, group_size);
  padded_numel_ = sizes.padded;
  shard_numel_ = sizes.shard;
  shard_begin_ = group_rank * shard_numel_;
  const int64_t shard_begin = shard_begin_;
  for (auto& entry : entries_) {
    const int64_t begin = std::clamp(shard_begin, entry.offset, entry.offset + entry.numel);
    const int64_t end = std::clamp(shard_begin + shard_numel_, entry.offset, entry.offset + entry.numel);
    entry.local_begin = begin - entry.offset;
    entry.local_count = end - begin;
  }

  // The shard is written piece by piece, never through a full-size copy of
  // the unit: a deferred parameter (dtrain/deferred_init.h) has no storage
  // yet and is filled in later by take_piece(), once materialised, so
  // building a unit costs its shard plus, at most, one module at full size.
  torch::NoGradGuard no_grad;
  shard_ = torch::zeros({shard_numel_}, master);
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!is_deferred(entries_[i].param)) take_piece(i);
  }

  full_is_shard_ = group_size == 1 && compute_dtype_ == shard_.scalar_type();
  full_ = full_is_shard_ ? shard_ : storageless({padded_numel_}, master.dtype(compute_dtype_));  // allocate_full gives it bytes
}

void FlatParameter::take_piece(size_t i) {
  torch::NoGradGuard no_grad;
  auto& entry = entries_[i];
  if (is_deferred(entry.param)) {
    throw std::logic_error("FSDP: parameter '" + entry.name + "' has no storage yet; materialise it first");
  }
  shard_piece(shard_, i).copy_(entry.param.detach().reshape({-1}).narrow(0, entry.local_begin, entry.local_count));
  entry.param.set_data(shard_piece(shard_, i));
}

bool FlatParameter::all_pieces_taken() const {
  for (const auto& entry : entries_) {
    if (is_deferred(entry.param)) return false;
  }
  return true;
}

int64_t FlatParameter::local_offset(size_t i) const {
  const auto& entry = entries_[i];
  return entry.local_count == 0 ? 0 : entry.offset + entry.local_begin - shard_begin_;
}

torch::Tensor FlatParameter::shard_piece(const torch::Tensor& flat_shard, size_t i) const {
  return flat_shard.narrow(0, local_offset(i), entries_[i].local_count);
}

bool FlatParameter::full_allocated() const { return full_.storage().nbytes() > 0; }

void FlatParameter::allocate_full() {
  if (full_is_shard_ || full_allocated()) return;
  auto* storage = full_.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(padded_numel_) * full_.element_size();
  // The CUDA allocator allocates on the current device; make that the
  // buffer's own (cuda:LOCAL_RANK), whatever the calling thread's is.
  c10::DeviceGuard on_device(full_.device());
  storage->set_data_ptr_noswap(c10::GetAllocator(full_.device().type())->allocate(bytes));
  storage->set_nbytes(bytes);
}

void FlatParameter::free_full() {
  if (full_is_shard_) return;
  auto* storage = full_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, full_.device()));
  storage->set_nbytes(0);
}

torch::Tensor FlatParameter::full_for_writing() const {
  torch::NoGradGuard no_grad;
  return torch::empty({0}, full_.options()).set_(full_.storage(), 0, {padded_numel_});
}

const void* FlatParameter::full_storage() const { return full_.storage().unsafeGetStorageImpl(); }

void FlatParameter::use_full_views() {
  torch::NoGradGuard no_grad;
  for (auto& entry : entries_) entry.param.set_data(full_.narrow(0, entry.offset, entry.numel).view(entry.shape));
  using_full_views_ = true;
}

void FlatParameter::use_shard_views() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < entries_.size(); ++i) entries_[i].param.set_data(shard_piece(shard_, i));
  using_full_views_ = false;
}

}  // namespace dtrain::detail
