// `dtrain tokenize`: train a subword tokenizer on a text corpus and encode
// the corpus to a token file (include/dtrain/tokenizer.h).
//
//   dtrain tokenize --corpus /usr/share/games/fortunes --vocab-size 4000 --output /tmp/fortunes
//     -> /tmp/fortunes.model, /tmp/fortunes.vocab, /tmp/fortunes.bin
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace dtrain::cli {

struct TokenizeFlags {
  std::string corpus = "/usr/share/games/fortunes";
  std::string output;
  int64_t vocab_size = 4000;
  std::string type = "bpe";
  std::string tokenizer;  // an existing model: encode only
};

CLI::App* add_tokenize_subcommand(CLI::App& app, TokenizeFlags& flags);
int tokenize_main(const TokenizeFlags& flags);

}  // namespace dtrain::cli
