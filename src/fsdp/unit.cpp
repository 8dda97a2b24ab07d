#include "fsdp/unit.h"
#include "fsdp/compression.h"
#include "fsdp/schedule_rules.h"

#include "common/tensor_alias.h"

#include <dtrain/float8.h>
#include <dtrain/trace.h>

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <stdexcept>

namespace dtrain::detail {

const char* to_string(TrainingState state) {
  switch (state) {
    case TrainingState::Idle: return "idle";
    case TrainingState::Forward: return "forward";
    case TrainingState::ForwardDone: return "after forward";
    case TrainingState::PreBackward: return "backward";
    case TrainingState::PostBackward: return "after its backward";
  }
  return "?";
}

Unit::Unit(std::string name, const torch::nn::Module* module, std::vector<std::string> parameter_names,
           std::vector<torch::Tensor> parameters, UnitGroups groups, const FSDPOptions& options)
    : name_(std::move(name)),
      trace_name_(trace::intern(name_.empty() ? "(root)" : name_)),
      module_(module),
      flat_(std::move(parameter_names), std::move(parameters), groups.shard->size(), groups.shard->rank(),
            options.mixed_precision.param_dtype, options.device),
      groups_(groups),
      options_(options) {
  auto override_it = options.compression_by_unit.find(name_);
  compression_ = override_it != options.compression_by_unit.end() ? override_it->second : options.compression;
  const int64_t group = groups.shard->size();
  param_format_ = fsdp_rules::effective_format(fsdp_rules::wire_format(compression_.params), group);
  // bf16 parameters computed in bf16 already travel as bf16: the plain gather.
  if (param_format_ == fsdp_rules::WireFormat::BF16 && options.mixed_precision.param_dtype == torch::kBFloat16)
    param_format_ = fsdp_rules::WireFormat::Plain;
  grad_format_ = fsdp_rules::effective_format(fsdp_rules::wire_format(compression_.grads), group);
  if (fsdp_rules::reduces_in_place(options.strategy)) grad_format_ = fsdp_rules::WireFormat::Plain;
  ready_.assign(flat_.entries().size(), 0);
  stashed_.resize(flat_.entries().size());
  for (const auto& entry : flat_.entries()) expected_gradients_ += entry.param.requires_grad() ? 1 : 0;
}

Unit::~Unit() {
  if (float8_codes_.defined()) clear_gathered_float8_weights(flat_.full_storage());
}

void Unit::transition(TrainingState from, TrainingState to) {
  if (state_ != from) {
    throw std::logic_error("FSDP: unit " + display_name() + " cannot go from state '" + to_string(state_) +
                           "' to '" + to_string(to) + "' (only from '" + to_string(from) + "')");
  }
  state_ = to;
}

namespace {
const CommStream kComputeStream;  // inactive: issue from the current stream
}  // namespace

const CommStream& Unit::gather_stream() const { return streams_.gather ? *streams_.gather : kComputeStream; }
const CommStream& Unit::reduce_stream() const { return streams_.reduce ? *streams_.reduce : kComputeStream; }

void Unit::begin_forward() { transition(TrainingState::Idle, TrainingState::Forward); }
void Unit::end_forward() { transition(TrainingState::Forward, TrainingState::ForwardDone); }
void Unit::begin_backward() { transition(TrainingState::ForwardDone, TrainingState::PreBackward); }
void Unit::end_backward() { transition(TrainingState::PreBackward, TrainingState::PostBackward); }

bool Unit::start_unshard() {
  if (gather_work_ || flat_.using_full_views()) return false;
  if (flat_.full_is_shard()) return false;
  torch::NoGradGuard no_grad;
  flat_.allocate_full();  // on the compute stream, which uses it (Note [communication streams])
  const CommStream& stream = gather_stream();
  stream.wait_for_current();  // the shard's last update, and the buffer's last use
  const CommStream::Scope on_stream(stream);
  const trace::Label label("unit", index_, trace_name_);
  const int64_t group = groups_.shard->size();
  if (float8_) {
    const auto byte_options = flat_.shard().options().dtype(torch::kByte);
    gather_source_ = torch::empty({float8_->record_bytes()}, byte_options);
    float8_->encode(flat_, gather_source_);
    gathered_records_ = torch::empty({float8_->record_bytes() * group}, byte_options);
    if (stats_) stats_->all_gather_bytes += float8_->record_bytes() * group;
    gather_work_ = groups_.shard->all_gather(gather_source_, gathered_records_);
  } else if (param_format_ == fsdp_rules::WireFormat::Plain) {
    gather_source_ = flat_.shard().to(options_.mixed_precision.param_dtype);
    auto full = flat_.full_for_writing();
    if (stats_) stats_->all_gather_bytes += static_cast<int64_t>(full.nbytes());
    gather_work_ = groups_.shard->all_gather(gather_source_, full);
  } else {
    // Every rank sends its shard's record; all of them, this rank's too,
    // are decoded into the full buffer (complete_gather), so every rank
    // computes with the same weights.
    const int64_t bytes = fsdp_rules::record_bytes(param_format_, flat_.shard_numel(), compression_.block_size, 0);
    const auto byte_options = flat_.shard().options().dtype(torch::kByte);  // the shard's device
    gather_source_ = torch::empty({bytes}, byte_options);
    encode_record(param_format_, compression_.block_size, flat_.shard(), gather_source_);
    gathered_records_ = torch::empty({bytes * group}, byte_options);
    if (stats_) stats_->all_gather_bytes += bytes * group;
    gather_work_ = groups_.shard->all_gather(gather_source_, gathered_records_);
  }
  if (stats_) ++stats_->all_gather_calls;
  return true;
}

void Unit::complete_gather() {
  if (!gather_work_) return;
  const WorkPtr work = std::move(gather_work_);
  work->wait();
  gather_source_ = torch::Tensor();
  // The compute stream uses the full parameters after this gather, and not
  // after a prefetch that may already be queued behind it on the gather stream.
  const CommStream& stream = gather_stream();
  stream.current_waits(work.get());
  if (!gathered_records_.defined()) return;
  // Decoded on the compute stream, after that wait.
  stream.used_on_current(gathered_records_);
  torch::NoGradGuard no_grad;
  const int64_t shard = flat_.shard_numel();
  const int64_t bytes = gathered_records_.numel() / groups_.shard->size();
  auto full = flat_.full_for_writing();
  if (float8_) {
    float8_->decode(flat_, gathered_records_, full, float8_codes_);
    gathered_records_ = torch::Tensor();
    return;
  }
  for (int r = 0; r < groups_.shard->size(); ++r) {
    full.narrow(0, r * shard, shard)
        .copy_(decode_record(param_format_, compression_.block_size, gathered_records_.narrow(0, r * bytes, bytes), shard));
  }
  gathered_records_ = torch::Tensor();
}

std::vector<char> Unit::float8_candidates() const {
  std::vector<char> candidates(flat_.entries().size(), 0);
  // Only where the plain gather crosses a wire: compressed params keep their
  // compression, and a one-rank group sends nothing.
  if (param_format_ != fsdp_rules::WireFormat::Plain || groups_.shard->size() == 1) return candidates;
  for (size_t i = 0; i < candidates.size(); ++i)
    candidates[i] = flat_.entries()[i].shape.size() == 2 && float8_took(flat_.full_storage(), flat_.entries()[i].offset) ? 1 : 0;
  return candidates;
}

void Unit::gather_as_float8(const std::vector<char>& agreed) {
  if (std::find(agreed.begin(), agreed.end(), 1) == agreed.end()) {
    float8_.reset();  // none: the plain gather
    return;
  }
  float8_.emplace(flat_, agreed, groups_.shard->size(), options_.mixed_precision.param_dtype);
}

torch::Tensor Unit::float8_local_amax() const {
  return float8_ ? float8_->local_amax(flat_) : torch::Tensor();
}

void Unit::set_float8_amax(const torch::Tensor& amax) {
  if (float8_) float8_->set_amax(amax);
}

void Unit::finish_unshard() {
  if (!gather_work_ && !flat_.using_full_views()) start_unshard();
  complete_gather();
  if (!flat_.using_full_views()) flat_.use_full_views();
}

void Unit::reshard(bool free_full) {
  // A prefetch that was never used: OptimizerOnly keeps the buffer, so it
  // must hold what arrived.
  complete_gather();
  if (flat_.using_full_views()) flat_.use_shard_views();
  if (float8_codes_.defined()) {  // Note [gathered float8 weights]: the next gather brings the next step's
    clear_gathered_float8_weights(flat_.full_storage());
    float8_codes_ = torch::Tensor();
  }
  if (free_full) flat_.free_full();
}

void Unit::stash_shard_gradients() {
  auto& entries = flat_.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    auto& grad = entries[i].param.mutable_grad();
    if (grad.defined()) {
      stashed_[i] = grad;
      grad = torch::Tensor();
    }
  }
}

bool Unit::on_gradient_ready(size_t parameter) {
  if (state_ != TrainingState::PreBackward) {
    throw std::runtime_error("FSDP: unit " + display_name() + " received the gradient of parameter '" +
                             flat_.entries()[parameter].name + "' while it was " + to_string(state_) +
                             ", not gathered for backward. Its parameters were used outside the unit's call: enter "
                             "the module through dtrain::Sharded<> (or as a child of the root Sequential), or "
                             "leave it out of the wrap policy.");
  }
  if (ready_[parameter]) {
    throw std::logic_error("FSDP: parameter '" + flat_.entries()[parameter].name +
                           "' received its gradient twice in one backward pass");
  }
  ready_[parameter] = 1;
  return ++ready_count_ == expected_gradients_;
}

void Unit::reduce_gradients(bool sync) {
  torch::NoGradGuard no_grad;
  const auto reduce_dtype = options_.mixed_precision.reduce_dtype;
  // A reduction copies the gradients in on its own stream; a no_sync
  // accumulation stays on the compute stream.
  const CommStream& stream = sync ? reduce_stream() : kComputeStream;
  stream.wait_for_current();  // the gradients' last writes
  const CommStream::Scope on_stream(stream);
  auto full = torch::zeros({flat_.padded_numel()}, flat_.shard().options().dtype(reduce_dtype));
  auto& entries = flat_.entries();
  for (auto& entry : entries) {
    auto& grad = entry.param.mutable_grad();
    if (grad.defined()) {
      full.narrow(0, entry.offset, entry.numel).copy_(grad.reshape({-1}));
      stream.used_here(grad);  // made on the compute stream, read on this one
      grad = torch::Tensor();  // the full-size gradient is freed here
    }
  }
  if (unsynced_full_gradient_.defined()) {
    full.add_(unsynced_full_gradient_);
    stream.used_here(unsynced_full_gradient_);
    unsynced_full_gradient_ = torch::Tensor();
  }
  ready_.assign(ready_.size(), 0);
  ready_count_ = 0;
  if (!sync) {
    unsynced_full_gradient_ = full;
    return;
  }
  // The unit holds `full` until backward waits for the reduction
  // (wait_reduction), not only until the operation finishes: the moment the
  // memory goes back is then the same in every run, so `dtrain plan` can
  // predict the peak to the byte.
  full_gradient_ = full;
  reduction_started_ = true;
  const trace::Label label("unit", index_, trace_name_);
  if (stats_) ++stats_->reduce_scatter_calls;
  if (fsdp_rules::reduces_in_place(options_.strategy)) {
    if (stats_) stats_->reduce_scatter_bytes += static_cast<int64_t>(full.nbytes());
    reduce_work_ = groups_.shard->all_reduce(full_gradient_, ReduceOp::Avg);
  } else if (grad_format_ == fsdp_rules::WireFormat::Plain) {
    if (stats_) stats_->reduce_scatter_bytes += static_cast<int64_t>(full.nbytes());
    shard_gradient_ = torch::empty({flat_.shard_numel()}, full.options());
    reduce_work_ = groups_.shard->reduce_scatter(full_gradient_, shard_gradient_, ReduceOp::Avg);
  } else {
    // The Communicator widens a bf16 reduction to fp32 before a backend sees
    // it (Note [backend contract]), so a narrow reduce-scatter would send
    // fp32. Instead: each destination rank's chunk encoded, one all-to-all
    // of bytes, and the receiver sums the chunks in fp32.
    const int group = groups_.shard->size();
    const int64_t shard = flat_.shard_numel();
    const int64_t bytes = fsdp_rules::record_bytes(grad_format_, shard, compression_.block_size, 0);
    const auto byte_options = full.options().dtype(torch::kByte);
    auto send = torch::empty({bytes * group}, byte_options);
    for (int r = 0; r < group; ++r)
      encode_record(grad_format_, compression_.block_size, full.narrow(0, r * shard, shard), send.narrow(0, r * bytes, bytes));
    full_gradient_ = send;  // the full-size gradient itself is freed here
    gradient_records_ = torch::empty({bytes * group}, byte_options);
    if (stats_) stats_->reduce_scatter_bytes += bytes * group;
    reduce_work_ = groups_.shard->all_to_all(send, gradient_records_);
  }
}

void Unit::complete_compressed_reduction() {
  if (!gradient_records_.defined()) return;
  torch::NoGradGuard no_grad;
  const int group = groups_.shard->size();
  const int64_t shard = flat_.shard_numel();
  const int64_t bytes = gradient_records_.numel() / group;
  // In rank order, so every run sums the same way.
  auto sum = torch::zeros({shard}, gradient_records_.options().dtype(torch::kFloat));
  for (int r = 0; r < group; ++r)
    sum.add_(decode_record(grad_format_, compression_.block_size, gradient_records_.narrow(0, r * bytes, bytes), shard));
  sum.div_(group);  // ReduceOp::Avg, as the plain reduce-scatter divides
  shard_gradient_ = sum.to(options_.mixed_precision.reduce_dtype);
  gradient_records_ = torch::Tensor();
}

void Unit::settle_reduction() {
  reduce_work_->wait();
  // The compute stream reads the result after this reduction (and not after
  // the next unit's, which may already be queued behind it).
  const CommStream& stream = reduce_stream();
  stream.current_waits(reduce_work_.get());
  // Compressed: the records are summed on the compute stream, after that wait.
  stream.used_on_current(gradient_records_);
  complete_compressed_reduction();
}

void Unit::settle_in_flight() noexcept {
  // Only where the collectives run on streams of their own: on the host
  // nothing is left for a stream to write into a buffer about to be freed.
  if (!gather_stream().active() && !reduce_stream().active()) return;
  try {
    complete_gather();
    if (reduce_work_) settle_reduction();
  } catch (...) {
    // The operation failed; its error was (or will be) reported where it was waited for.
  }
}

void Unit::wait_reduction() {
  if (!reduce_work_) return;
  settle_reduction();
  // OptimizerOnly's .grad will view the all-reduced buffer; the others only need the shard.
  if (!fsdp_rules::reduces_in_place(options_.strategy)) full_gradient_ = torch::Tensor();
}

void Unit::finish_gradients() {
  if (!reduction_started_) return;
  torch::NoGradGuard no_grad;
  settle_reduction();
  reduce_work_.reset();
  // Made on the reduce stream, read (and, as .grad, kept) on the compute stream.
  reduce_stream().used_on_current(shard_gradient_);
  reduce_stream().used_on_current(full_gradient_);
  if (fsdp_rules::reduces_in_place(options_.strategy)) {
    shard_gradient_ = full_gradient_.narrow(0, groups_.shard->rank() * flat_.shard_numel(), flat_.shard_numel());
  }
  full_gradient_ = torch::Tensor();
  if (groups_.replicate && groups_.replicate->size() > 1) {
    const trace::Label label("unit", index_, trace_name_);
    if (stats_) stats_->replica_all_reduce_bytes += static_cast<int64_t>(shard_gradient_.nbytes());
    groups_.replicate->blocking().all_reduce(shard_gradient_, ReduceOp::Avg);
  }
  // Gradients in the master dtype, shaped like the parameters' shards.
  auto gradient = shard_gradient_.to(flat_.shard().scalar_type()).contiguous();
  shard_gradient_ = torch::Tensor();
  auto& entries = flat_.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!entries[i].param.requires_grad()) continue;
    // Not a view: Optimizer::zero_grad() detaches gradients in place.
    auto piece = alias_of(gradient, flat_.local_offset(i), {flat_.entries()[i].local_count});
    if (stashed_[i].defined()) {
      piece = piece + stashed_[i];
      stashed_[i] = torch::Tensor();
    }
    entries[i].param.mutable_grad() = piece;
  }
  reduction_started_ = false;
}

}  // namespace dtrain::detail
