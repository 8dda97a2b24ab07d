#include "dtrain/data.h"

#include "data/batch_index.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace dtrain::data {

TextDataset::TextDataset(const TextCorpus& corpus, Split split, const TextOptions& options)
    : seq_len_(options.seq_len), stride_(options.stride == 0 ? options.seq_len : options.stride) {
  if (options.seq_len <= 0)
    throw std::invalid_argument("TextDataset: seq_len must be positive, got " + std::to_string(options.seq_len));
  if (stride_ <= 0)
    throw std::invalid_argument("TextDataset: stride must be positive (or 0 for seq_len), got " +
                                std::to_string(options.stride));
  if (!(options.validation_fraction > 0.0 && options.validation_fraction < 1.0))
    throw std::invalid_argument("TextDataset: validation_fraction must be in (0, 1), got " +
                                std::to_string(options.validation_fraction));

  const int64_t n = corpus.bytes.numel();
  const auto validation = static_cast<int64_t>(std::floor(static_cast<double>(n) * options.validation_fraction));
  bytes_ = split == Split::Train ? corpus.bytes.narrow(0, 0, n - validation)
                                 : corpus.bytes.narrow(0, n - validation, validation);
  make_windows(std::string("the ") + (split == Split::Train ? "train" : "validation") + " split", "bytes");
}

TextDataset::TextDataset(const torch::Tensor& tokens, const TextOptions& options, const std::string& what)
    : bytes_(tokens.flatten()), seq_len_(options.seq_len), stride_(options.stride == 0 ? options.seq_len : options.stride) {
  if (options.seq_len <= 0)
    throw std::invalid_argument("TextDataset: seq_len must be positive, got " + std::to_string(options.seq_len));
  if (stride_ <= 0)
    throw std::invalid_argument("TextDataset: stride must be positive (or 0 for seq_len), got " +
                                std::to_string(options.stride));
  make_windows(what, "tokens");
}

void TextDataset::make_windows(const std::string& what, const std::string& unit) {
  // A window needs seq_len inputs plus the one token after them as the last target.
  const int64_t m = bytes_.numel();
  if (m < seq_len_ + 1)
    throw std::invalid_argument("TextDataset: " + what + " has " + std::to_string(m) +
                                " " + unit + ", fewer than seq_len + 1 = " + std::to_string(seq_len_ + 1) +
                                ": use a larger corpus or a shorter seq_len");
  size_ = (m - seq_len_ - 1) / stride_ + 1;
}

int64_t TextDataset::size() const { return size_; }

Batch TextDataset::get_batch(const std::vector<int64_t>& indices) const {
  auto starts = batch_index(indices, size_, "TextDataset") * stride_;
  // One gather of [B, seq_len + 1] bytes gives both inputs and targets.
  auto positions = starts.unsqueeze(1) + torch::arange(seq_len_ + 1, torch::kLong).unsqueeze(0);
  auto windows = bytes_.take(positions).to(torch::kLong);
  return {windows.narrow(1, 0, seq_len_).contiguous(), windows.narrow(1, 1, seq_len_).contiguous()};
}

}  // namespace dtrain::data
