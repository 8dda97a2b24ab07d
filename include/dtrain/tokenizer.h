// Subword tokenizers through SentencePiece's C++ library (BPE or unigram):
// trained on a text corpus, encoding it to a token file that `dtrain train
// --data tokens:PATH` reads, and decoding the ids a model generates.
//
//   dtrain::data::train_tokenizer({.corpus = "/usr/share/games/fortunes", .prefix = "/tmp/fortunes",
//                                  .vocab_size = 2000});
//   dtrain::data::Tokenizer tokenizer("/tmp/fortunes.model");
//   auto ids = tokenizer.encode("Hello\n");             // tokenizer.decode(ids) == "Hello\n"
//
// The models dtrain trains are lossless on text: no normalisation, spaces
// kept as they are, no dummy prefix, and bytes no piece covers (a newline,
// a character the corpus never showed) spelled as byte pieces (<0x0A>), so
// decode(encode(text)) == text for any UTF-8 text.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace dtrain::data {

class Tokenizer {
 public:
  // Loads a SentencePiece model file (PREFIX.model). Throws
  // std::invalid_argument naming the file when it is missing or not a model.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  std::vector<int64_t> encode(const std::string& text) const;
  // Throws std::invalid_argument for an id outside the vocabulary.
  std::string decode(const std::vector<int64_t>& ids) const;
  int64_t vocab_size() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

struct TokenizerTraining {
  std::string corpus;          // a text file, or a folder of them (read_text_corpus)
  std::string prefix;          // writes PREFIX.model and PREFIX.vocab
  int64_t vocab_size = 8000;   // at most; a corpus with fewer pieces gives fewer
  std::string type = "bpe";    // bpe | unigram
  int threads = 1;
};

// Trains a tokenizer on the corpus's lines. Throws std::invalid_argument for
// bad options (naming them) and std::runtime_error with SentencePiece's
// message when training fails.
void train_tokenizer(const TokenizerTraining& options);

// Encodes the corpus into one token file in llm.c's layout (a 256-int32
// header: magic 20240520 and uint16 ids for a vocabulary of at most 65536,
// else 20240801 and uint32), written atomically; returns the number of ids.
int64_t encode_corpus(const Tokenizer& tokenizer, const std::string& corpus, const std::string& path);

}  // namespace dtrain::data
