// dtrain/tokenizer.h: SentencePiece models trained, loaded, and used to
// encode corpora and decode samples.
#include "dtrain/tokenizer.h"

#include "dtrain/data.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

namespace dtrain::data {
namespace {

// The corpus as text (read_text_corpus: a file, or a folder's text files).
std::string corpus_text(const std::string& corpus) {
  const TextCorpus text = read_text_corpus(corpus);
  const auto* bytes = static_cast<const char*>(text.bytes.data_ptr());
  return std::string(bytes, static_cast<size_t>(text.bytes.numel()));
}

// Each line of the text, newline left out, empty lines skipped: the
// sentences SentencePiece learns pieces from.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::string& text) : text_(text) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    while (position_ < text_.size()) {
      const size_t end = std::min(text_.find('\n', position_), text_.size());
      line_.assign(text_, position_, end - position_);
      position_ = end + 1;
      if (!line_.empty()) return;
    }
    done_ = true;
  }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::string& text_;
  size_t position_ = 0;
  std::string line_;
  bool done_ = false;
};

}  // namespace

Tokenizer::Tokenizer(const std::string& model_path)
    : path_(model_path), processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(model_path, error))
    throw std::invalid_argument("tokenizer " + model_path + ": no such file (a SentencePiece .model, e.g. from dtrain tokenize)");
  const auto status = processor_->Load(model_path);
  if (!status.ok())
    throw std::invalid_argument("tokenizer " + model_path + " is not a SentencePiece model: " + status.ToString());
}

Tokenizer::~Tokenizer() = default;

std::vector<int64_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = processor_->Encode(text, &ids);
  if (!status.ok()) throw std::runtime_error("tokenizer " + path_ + ": " + status.ToString());
  return {ids.begin(), ids.end()};
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<int> narrow;
  narrow.reserve(ids.size());
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw std::invalid_argument("tokenizer " + path_ + ": id " + std::to_string(id) + " is outside its vocabulary of " +
                                  std::to_string(vocab_size()));
    narrow.push_back(static_cast<int>(id));
  }
  std::string text;
  const auto status = processor_->Decode(narrow, &text);
  if (!status.ok()) throw std::runtime_error("tokenizer " + path_ + ": " + status.ToString());
  return text;
}

int64_t Tokenizer::vocab_size() const { return processor_->GetPieceSize(); }

void train_tokenizer(const TokenizerTraining& options) {
  if (options.type != "bpe" && options.type != "unigram")
    throw std::invalid_argument("tokenizer type '" + options.type + "' is not one of: bpe, unigram");
  // 256 byte pieces and the unknown, begin and end pieces come first.
  if (options.vocab_size < 300 || options.vocab_size > (int64_t{1} << 31) - 1)
    throw std::invalid_argument("tokenizer vocabulary of " + std::to_string(options.vocab_size) +
                                " is too small: it needs at least 300 (256 byte pieces, the special ones, and subwords)");
  if (options.prefix.empty()) throw std::invalid_argument("tokenizer: give the output prefix");
  const std::string text = corpus_text(options.corpus);
  LineIterator lines(text);
  const std::unordered_map<std::string, std::string> arguments{
      {"model_prefix", options.prefix},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"model_type", options.type},
      // Lossless: the text as it is (see the header).
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"byte_fallback", "true"},
      {"character_coverage", "1.0"},
      // A small corpus may not have vocab_size pieces: fewer, not an error.
      {"hard_vocab_limit", "false"},
      {"max_sentence_length", "65536"},
      {"num_threads", std::to_string(std::max(1, options.threads))},
      {"minloglevel", "2"}};
  const auto status = sentencepiece::SentencePieceTrainer::Train(arguments, &lines);
  if (!status.ok()) throw std::runtime_error("training the tokenizer on " + options.corpus + ": " + status.ToString());
}

int64_t encode_corpus(const Tokenizer& tokenizer, const std::string& corpus, const std::string& path) {
  const std::string text = corpus_text(corpus);
  const bool wide = tokenizer.vocab_size() > 65536;
  const std::string temporary = path + ".tmp";
  std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error(path + ": cannot be written");
  int32_t header[256] = {};
  out.write(reinterpret_cast<const char*>(header), sizeof header);  // rewritten once the count is known
  int64_t count = 0;
  // Line by line, newline included: the pieces never span lines (the
  // tokenizer learnt from lines), so the ids are those of the whole text.
  for (size_t position = 0; position < text.size();) {
    const size_t end = std::min(text.find('\n', position), text.size() - 1) + 1;
    for (int64_t id : tokenizer.encode(text.substr(position, end - position))) {
      if (wide) {
        const auto value = static_cast<uint32_t>(id);
        out.write(reinterpret_cast<const char*>(&value), sizeof value);
      } else {
        const auto value = static_cast<uint16_t>(id);
        out.write(reinterpret_cast<const char*>(&value), sizeof value);
      }
      ++count;
    }
    position = end;
  }
  if (count > INT32_MAX) throw std::runtime_error(path + ": more ids than llm.c's header can count");
  header[0] = wide ? 20240801 : 20240520;
  header[1] = wide ? 7 : 1;
  header[2] = static_cast<int32_t>(count);
  out.seekp(0);
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  out.flush();
  if (!out) {
    std::remove(temporary.c_str());
    throw std::runtime_error(path + ": cannot be written");
  }
  out.close();
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) throw std::runtime_error(path + ": cannot be written (" + error.message() + ")");
  return count;
}

}  // namespace dtrain::data
