#include "fsdp/float8_gather.h"

#include <dtrain/float8.h>

#include <torch/torch.h>

#include <algorithm>
#include <functional>

// Note [float8 all-gather]
// Under --fp8 tensorwise, a weight that dtrain::linear multiplies in fp8 is
// cast to e4m3 before its unit's all-gather instead of after it, so a byte
// per element crosses the wire instead of the compute dtype's two (or four).
// - Which weights: those dtrain::linear took in fp8 in the first step
//   (dtrain::float8_took, asked of each entry's gathered view), agreed over
//   the ranks by an all-reduce (min) before the second step's first gather;
//   the first step gathers as before. The head, the embeddings and the
//   layers the width filter leaves never reach it. A one-rank group sends
//   nothing, so it gathers as before too.
// - The scale: the amax over the ranks' parts of the weight, one all-reduce
//   (max) for every unit's weights before each root forward, i.e. after the
//   optimizer step (torchao precomputes it there too). Taken in the
//   compute dtype's rounding and scaled in it, as dtrain::float8_cast scales
//   the gathered weight, so the fp8 codes are the ones the unsharded cast
//   makes.
// - After the gather the tensorwise layer multiplies the gathered codes
//   directly, without casting the weight (Note [gathered float8 weights]),
//   and each fp8 weight is also decoded into the unit's full buffer (e4m3
//   times a power of two is exact in bf16 and fp32), so any other reader of
//   the weight sees the values the fp8 multiply uses. A cast of those
//   values would give the same products (the scales being powers of two):
//   training is bitwise the same as with the plain gather (test_fsdp_float8).
// - Left for later: not allocating the full buffer's bf16 copy of those
//   weights (while gathered a unit holds it and the codes, a byte per
//   element more than the plain gather).

namespace dtrain::detail {

namespace {

int64_t element_size(torch::ScalarType dtype) { return static_cast<int64_t>(c10::elementSize(dtype)); }

}  // namespace

Float8Gather::Float8Gather(const FlatParameter& flat, std::vector<char> fp8, int group_size,
                           torch::ScalarType compute_dtype)
    : group_size_(group_size), compute_dtype_(compute_dtype) {
  const auto& entries = flat.entries();
  for (size_t i = 0; i < entries.size(); ++i)
    (fp8[i] ? fp8_entries_ : other_entries_).push_back(static_cast<int64_t>(i));
  const int64_t shard = flat.shard_numel();
  // Each rank's part of the other entries, in entry order (as encode packs it).
  std::vector<int64_t> counts(static_cast<size_t>(group_size), 0);
  const auto for_each_part = [&](const std::function<void(int, int64_t, int64_t)>& visit) {
    for (int r = 0; r < group_size; ++r) {
      for (const int64_t i : other_entries_) {
        const auto& entry = entries[static_cast<size_t>(i)];
        const int64_t begin = std::max(entry.offset, r * shard);
        const int64_t end = std::min(entry.offset + entry.numel, (r + 1) * shard);
        if (begin < end) visit(r, begin, end);
      }
    }
  };
  for_each_part([&](int r, int64_t begin, int64_t end) { counts[static_cast<size_t>(r)] += end - begin; });
  hp_per_rank_ = *std::max_element(counts.begin(), counts.end());
  std::vector<torch::Tensor> flat_index, source_index;
  std::vector<int64_t> placed(static_cast<size_t>(group_size), 0);
  const auto longs = torch::TensorOptions().dtype(torch::kLong);
  for_each_part([&](int r, int64_t begin, int64_t end) {
    flat_index.push_back(torch::arange(begin, end, longs));
    const int64_t first = r * hp_per_rank_ + placed[static_cast<size_t>(r)];
    source_index.push_back(torch::arange(first, first + (end - begin), longs));
    placed[static_cast<size_t>(r)] += end - begin;
  });
  const auto device = flat.shard().device();
  hp_flat_index_ = flat_index.empty() ? torch::empty({0}, longs) : torch::cat(flat_index);
  hp_source_index_ = source_index.empty() ? torch::empty({0}, longs) : torch::cat(source_index);
  hp_flat_index_ = hp_flat_index_.to(device);
  hp_source_index_ = hp_source_index_.to(device);
  record_bytes_ = shard + hp_per_rank_ * element_size(compute_dtype);
  scales_ = torch::ones({fp8_entry_count()}, flat.shard().options().dtype(torch::kFloat));
}

torch::Tensor Float8Gather::local_amax(const FlatParameter& flat) const {
  torch::NoGradGuard no_grad;
  auto amax = torch::zeros({fp8_entry_count()}, flat.shard().options().dtype(torch::kFloat));
  for (size_t k = 0; k < fp8_entries_.size(); ++k) {
    const auto piece = flat.shard_piece(flat.shard(), static_cast<size_t>(fp8_entries_[k]));
    // Rounding is monotonic: the amax of the rounded values is the rounded amax.
    if (piece.numel() > 0) amax[static_cast<int64_t>(k)].copy_(piece.abs().max().to(compute_dtype_));
  }
  return amax;
}

void Float8Gather::set_amax(const torch::Tensor& amax) { scales_ = float8_scale(amax, torch::kFloat8_e4m3fn); }

void Float8Gather::encode(const FlatParameter& flat, torch::Tensor& record) const {
  torch::NoGradGuard no_grad;
  const int64_t shard = flat.shard_numel();
  auto codes = record.narrow(0, 0, shard);
  codes.zero_();
  for (size_t k = 0; k < fp8_entries_.size(); ++k) {
    const auto i = static_cast<size_t>(fp8_entries_[k]);
    const auto piece = flat.shard_piece(flat.shard(), i);
    if (piece.numel() == 0) continue;
    // As dtrain::float8_cast scales the gathered weight: in the compute dtype.
    const auto scaled = piece.to(compute_dtype_) * scales_[static_cast<int64_t>(k)].to(compute_dtype_);
    codes.narrow(0, flat.local_offset(i), piece.numel()).copy_(scaled.to(torch::kFloat8_e4m3fn).view(torch::kUInt8));
  }
  const int64_t size = element_size(compute_dtype_);
  int64_t placed = 0;
  for (const int64_t i : other_entries_) {
    const auto piece = flat.shard_piece(flat.shard(), static_cast<size_t>(i));
    if (piece.numel() == 0) continue;
    record.narrow(0, shard + placed * size, piece.numel() * size)
        .copy_(piece.to(compute_dtype_).contiguous().view(torch::kUInt8));
    placed += piece.numel();
  }
  if (placed < hp_per_rank_) record.narrow(0, shard + placed * size, (hp_per_rank_ - placed) * size).zero_();
}

void Float8Gather::decode(const FlatParameter& flat, const torch::Tensor& records, torch::Tensor& full,
                          torch::Tensor& keep_codes) const {
  torch::NoGradGuard no_grad;
  const int64_t shard = flat.shard_numel();
  const auto rows = records.view({group_size_, record_bytes_});
  const auto codes = rows.narrow(1, 0, shard).reshape({-1});  // [padded]: every rank's codes in flat order
  const auto inverse = scales_.reciprocal();  // float32, as the layer's own casts give it
  const auto& entries = flat.entries();
  for (size_t k = 0; k < fp8_entries_.size(); ++k) {
    const auto& entry = entries[static_cast<size_t>(fp8_entries_[k])];
    const auto weight = codes.narrow(0, entry.offset, entry.numel).view(torch::kFloat8_e4m3fn).view(entry.shape);
    const auto inverse_k = inverse[static_cast<int64_t>(k)];
    full.narrow(0, entry.offset, entry.numel)
        .copy_(weight.reshape({-1}).to(compute_dtype_) * inverse_k.to(compute_dtype_));
    set_gathered_float8_weight(flat.full_storage(), entry.offset, {weight, inverse_k});
  }
  keep_codes = codes;
  if (hp_per_rank_ == 0) return;
  const auto values = rows.narrow(1, shard, hp_per_rank_ * element_size(compute_dtype_))
                          .contiguous()
                          .view(compute_dtype_)
                          .reshape({-1});
  full.index_copy_(0, hp_flat_index_, values.index_select(0, hp_source_index_));
}

}  // namespace dtrain::detail
