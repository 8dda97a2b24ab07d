#include "train/training_data.h"

#include "dtrain/model_spec.h"
#include "train/progress.h"

#include <stdexcept>

namespace dtrain::train {

std::string text_path(const std::string& data) { return data.rfind("text:", 0) == 0 ? data.substr(5) : ""; }
std::string tokens_path(const std::string& data) { return data.rfind("tokens:", 0) == 0 ? data.substr(7) : ""; }

namespace {

// --data tokens:PATH: the train and validation ids, checked against the
// model's vocabulary.
TrainingData load_tokens(const TrainConfig& config, const std::string& path) {
  data::TextOptions options;
  options.seq_len = config.seq_len;
  const data::TokenCorpus corpus =
      data::read_token_corpus(path, data::token_format_from(config.token_dtype), options.validation_fraction);
  for (const auto* split : {&corpus.train, &corpus.validation}) {
    if (split->numel() == 0) continue;
    const int64_t largest = split->max().item<int64_t>();
    if (largest >= config.vocab_size)
      throw std::runtime_error("--data tokens:" + path + " holds token id " + std::to_string(largest) +
                               ", outside the model's vocabulary of " + std::to_string(config.vocab_size) +
                               ": pass --vocab-size " + std::to_string(largest + 1) + " or more (the tokenizer's "
                               "vocabulary size)");
  }
  TrainingData result;
  result.train = std::make_unique<data::TextDataset>(corpus.train, options, "the train split of " + path);
  result.validation = std::make_unique<data::TextDataset>(corpus.validation, options, "the validation split of " + path);
  result.units_per_sample = config.seq_len;
  result.unit = "tokens";
  result.description = path + " (" + corpus.layout + ", " + format_count(corpus.train.numel()) + " train and " +
                       format_count(corpus.validation.numel()) + " validation tokens; " +
                       format_count(result.train->size()) + " train windows of " + std::to_string(config.seq_len) +
                       " tokens)";
  return result;
}

}  // namespace

TrainingData load_training_data(const TrainConfig& config) {
  TrainingData result;
  if (const ModelSpec& spec = find_model(config.model); spec.data) {
    ModelData own = spec.data(config);
    if (!own.train || !own.validation)
      throw std::invalid_argument("the model spec '" + spec.name + "': ModelSpec::data must give both a train and a "
                                  "validation dataset");
    if (own.train->size() < 1) throw std::runtime_error("the model spec '" + spec.name + "': its train dataset is empty");
    result.train = std::move(own.train);
    result.validation = std::move(own.validation);
    result.units_per_sample = own.units_per_sample;
    result.unit = own.unit;
    result.description = own.description.empty() ? spec.name + "'s own data (" + format_count(result.train->size()) +
                                                       " train, " + format_count(result.validation->size()) +
                                                       " validation samples)"
                                                 : own.description;
    return result;
  }
  if (config.data == "fashion-mnist") {
    result.train = std::make_unique<data::FashionMNIST>(data::Split::Train, config.fashion_mnist_dir);
    result.validation = std::make_unique<data::FashionMNIST>(data::Split::Validation, config.fashion_mnist_dir);
    result.description = "Fashion-MNIST (" + format_count(result.train->size()) + " train, " +
                         format_count(result.validation->size()) + " test images)";
    return result;
  }
  if (const std::string tokens = tokens_path(config.data); !tokens.empty()) return load_tokens(config, tokens);
  const std::string path = text_path(config.data);
  if (path.empty()) throw std::invalid_argument("--data '" + config.data + "' is not fashion-mnist, text:PATH or tokens:PATH");
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
