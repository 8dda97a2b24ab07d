// Datasets and the distributed sampler that feed dtrain's training loop.
//
// Every dataset is a fixed list of samples addressed by index. The sampler
// decides which indices form each step's global batch and which contiguous
// part of it a rank computes; the rank then fetches its part with
// get_batch(). Datasets load everything into memory at construction (the
// corpora dtrain ships with are tens of megabytes) so that get_batch() is a
// gather, never I/O.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace dtrain::data {

// Fashion-MNIST's validation split is its t10k (test) set; a text corpus's
// is its last bytes (see TextDataset).
enum class Split { Train, Validation };

struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // The samples at `indices`, stacked in that order along dim 0. Throws
  // std::out_of_range for an index outside [0, size()).
  virtual Batch get_batch(const std::vector<int64_t>& indices) const = 0;
};

// ---------------------------------------------------------------- Fashion-MNIST

inline constexpr const char* kFashionMNISTDir = "/usr/share/datasets/fashion-mnist";

// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from `dir` (gzipped
// IDX files, as the Debian package dataset-fashion-mnist installs them).
// inputs: float [B,1,28,28], pixels / 255 normalised as (x - 0.2860) / 0.3530
// (the train set's mean and standard deviation); targets: int64 [B] in 0..9.
// Throws std::runtime_error naming the file and what is wrong with it: a
// missing directory or file, bad magic number, unexpected dimensions, a
// truncated or overlong body, corrupt gzip data, a label outside 0..9.
class FashionMNIST : public Dataset {
 public:
  explicit FashionMNIST(Split split, const std::string& dir = kFashionMNISTDir);
  int64_t size() const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;

  const torch::Tensor& images() const { return images_; }  // [N,1,28,28] float, normalised
  const torch::Tensor& labels() const { return labels_; }  // [N] int64

 private:
  torch::Tensor images_;
  torch::Tensor labels_;
};

// ------------------------------------------------------------------- byte text

inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// The bytes of a text corpus: one file, or every text file under a folder
// (recursively, in byte order of their paths, each file once even when
// reached through symbolic links), concatenated. Files ending in .dat and
// binary files (any NUL byte, or more than 5% control characters other than
// whitespace, backspace and escape) are skipped in a folder and rejected as an
// explicit file.
struct TextCorpus {
  torch::Tensor bytes;             // uint8 [n]
  std::vector<std::string> files;  // the files read, in order
  std::vector<std::string> skipped;  // files under the folder left out as binary or .dat
};
// Throws std::runtime_error for a missing path, a folder without text files
// or an empty corpus.
TextCorpus read_text_corpus(const std::string& path = kFortunesDir);

struct TextOptions {
  int64_t seq_len = 64;
  int64_t stride = 0;                // distance between window starts; 0 means seq_len
  double validation_fraction = 0.1;  // the corpus's last bytes form the validation split
};

// Byte-level language-modelling windows over one split of a corpus.
// The train split is bytes [0, n - v), the validation split [n - v, n), with
// v = floor(n * validation_fraction). Within a split of m bytes, sample i is
//   inputs  = bytes[i*stride     .. i*stride + seq_len)
//   targets = bytes[i*stride + 1 .. i*stride + seq_len + 1)
// as int64 [seq_len] each (targets are the inputs shifted by one), and
// size() = (m - seq_len - 1) / stride + 1: every window whose target fits.
// Throws std::invalid_argument for bad options or a split too short for one
// window.
class TextDataset : public Dataset {
 public:
  TextDataset(const TextCorpus& corpus, Split split, const TextOptions& options = {});
  // Windows over all of `tokens` (any integer dtype, e.g. a token file's
  // int32 ids; options.validation_fraction is not used): the split is the
  // caller's. `what` names the tokens in errors.
  TextDataset(const torch::Tensor& tokens, const TextOptions& options, const std::string& what);
  int64_t size() const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;

  int64_t seq_len() const { return seq_len_; }
  const torch::Tensor& bytes() const { return bytes_; }  // this split's tokens (uint8 bytes for text)

 private:
  void make_windows(const std::string& what, const std::string& unit);
  torch::Tensor bytes_;
  int64_t seq_len_;
  int64_t stride_;
  int64_t size_;
};

// ------------------------------------------------------------------ token files

// How a token file stores its ids: nanoGPT's np.memmap layout (a flat array
// of uint16 or uint32, no header), or llm.c's (a header of 256 int32: magic
// 20240520 for uint16 ids or 20240801 for uint32, a version, the number of
// ids; then the ids). Auto: llm.c's when the file starts with one of its
// magics, else flat uint16.
enum class TokenFormat { Auto, UInt16, UInt32 };
// "auto" | "uint16" | "uint32"; throws std::invalid_argument naming them.
TokenFormat token_format_from(const std::string& name);

struct TokenFile {
  torch::Tensor tokens;  // int32 [n]
  std::string layout;    // "nanoGPT uint16", "nanoGPT uint32", "llm.c uint16", "llm.c uint32"
};
// Throws std::runtime_error naming the file and the problem: missing or
// unreadable, empty, a size that is not a whole number of ids, an llm.c
// header cut short or counting other than the ids that follow.
TokenFile read_token_file(const std::string& path, TokenFormat format = TokenFormat::Auto);

// The token files of a run (--data tokens:PATH): one file, whose last
// validation_fraction of ids are the validation split; or a folder with
// one file for each split, named as nanoGPT names them (train.bin, val.bin)
// or as llm.c does (*_train.bin, *_val.bin). Throws std::runtime_error for
// a folder without exactly one of each.
struct TokenCorpus {
  torch::Tensor train, validation;  // int32
  std::vector<std::string> files;
  std::string layout;
};
TokenCorpus read_token_corpus(const std::string& path, TokenFormat format, double validation_fraction);

// --------------------------------------------------------- distributed sampler

struct SamplerOptions {
  int64_t dataset_size = 0;       // N
  int64_t global_batch_size = 0;  // B: 1 <= B <= N and B >= world_size
  int world_size = 1;             // W
  int rank = 0;
  uint64_t seed = 0;
  bool shuffle = true;
  // Explicit local batch sizes, one per rank (e.g. from
  // split_batch_by_throughput): each >= 1, summing to B. Empty: the even
  // split shard_range(B, W, rank).
  std::vector<int64_t> local_batch_sizes = {};
};

// Splits a global batch of `global_batch` samples into one count per rank in
// proportion to `throughputs` (samples per second measured on each rank), so
// that a slow rank gets a smaller part. Every count is >= 1 and they sum to
// exactly global_batch. Deterministic (largest remainder; ties go to the lower
// rank), so every rank computes the same split from the same throughputs.
// Throws std::invalid_argument for an empty list, a throughput that is not a
// positive finite number, or global_batch < the number of ranks.
std::vector<int64_t> split_batch_by_throughput(int64_t global_batch, const std::vector<double>& throughputs);

// Which samples each step uses, identical on every rank and for every world
// size.
//
// The index stream is the concatenation of one ordering of 0..N-1 per epoch:
// epoch e's ordering is a permutation seeded by (seed, e) when shuffling
// (mt19937_64 from std::seed_seq and a hand-written Fisher-Yates, so it is
// the same on every platform and standard library), else 0..N-1. Step s's
// global batch is positions [s*B, (s+1)*B) of that stream, so it always holds
// exactly B samples, and a batch that crosses the end of an epoch takes the
// last samples of epoch e and the first of epoch e+1.
//
// A rank's part is the contiguous slice shard_range(B, W, rank) of the global
// batch (include/dtrain/comm.h): the first B % W ranks get one sample more.
// With options.local_batch_sizes set, rank r's part is instead the slice of
// that size starting after ranks 0..r-1's parts (heterogeneity-aware sizes).
// Parts are disjoint and their union, in rank order, is the global batch. To
// get the gradients of one process training on the global batch, weight each
// rank's mean loss by (local batch size * W / B) before DDP averages.
//
// Thread-safe; keeps the permutations of the two most recent epochs.
class DistributedSampler {
 public:
  explicit DistributedSampler(const SamplerOptions& options);

  std::vector<int64_t> global_batch(int64_t step) const;
  std::vector<int64_t> local_batch(int64_t step) const;  // this rank's part
  int64_t local_batch_size() const;                      // same for every step

  // The epoch in which step's first sample lies: floor(step * B / N).
  int64_t epoch_of_step(int64_t step) const;
  // Steps needed to serve every sample of epochs 0..epochs-1: ceil(epochs * N / B).
  int64_t steps_for_epochs(int64_t epochs) const;
  // Epoch e's ordering of 0..N-1 (the permutation when shuffling).
  std::vector<int64_t> epoch_order(int64_t epoch) const;

  const SamplerOptions& options() const { return options_; }

 private:
  const std::vector<int64_t>& cached_order(int64_t epoch) const;  // caller holds mutex_

  SamplerOptions options_;
  mutable std::mutex mutex_;
  mutable std::map<int64_t, std::vector<int64_t>> orders_;  // by epoch
};

}  // namespace dtrain::data
