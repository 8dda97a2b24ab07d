#include "train/training_data.h"

#include "train/progress.h"

#include <stdexcept>

namespace dtrain::train {

std::string text_path(const std::string& data) { return data.rfind("text:", 0) == 0 ? data.substr(5) : ""; }

TrainingData load_training_data(const TrainConfig& config) {
  TrainingData result;
  if (config.data == "fashion-mnist") {
    result.train = std::make_unique<data::FashionMNIST>(data::Split::Train, config.fashion_mnist_dir);
    result.validation = std::make_unique<data::FashionMNIST>(data::Split::Validation, config.fashion_mnist_dir);
    result.description = "Fashion-MNIST (" + format_count(result.train->size()) + " train, " +
                         format_count(result.validation->size()) + " test images)";
    return result;
  }
  const std::string path = text_path(config.data);
  if (path.empty()) throw std::invalid_argument("--data '" + config.data + "' is not fashion-mnist or text:PATH");
  const data::TextCorpus corpus = data::read_text_corpus(path);
  data::TextOptions options;
  options.seq_len = config.seq_len;
  result.train = std::make_unique<data::TextDataset>(corpus, data::Split::Train, options);
  result.validation = std::make_unique<data::TextDataset>(corpus, data::Split::Validation, options);
  result.units_per_sample = config.seq_len;
  result.unit = "tokens";
  result.description = path + " (" + format_count(corpus.bytes.numel()) + " bytes in " +
                       std::to_string(corpus.files.size()) + (corpus.files.size() == 1 ? " file" : " files") + "; " +
                       format_count(result.train->size()) + " train windows of " + std::to_string(config.seq_len) +
                       " bytes)";
  return result;
}

data::SamplerOptions sampler_options(const TrainConfig& config, const TrainingData& data, int ranks, int rank,
                                     std::vector<int64_t> local_batch_sizes) {
  return {.dataset_size = data.train->size(),
          .global_batch_size = config.batch_size,
          .world_size = ranks,
          .rank = rank,
          .seed = config.seed,
          .shuffle = config.shuffle,
          .local_batch_sizes = std::move(local_batch_sizes)};
}

}  // namespace dtrain::train
