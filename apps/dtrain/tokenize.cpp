#include "tokenize.h"

#include <dtrain/tokenizer.h>

#include <algorithm>
#include <iostream>
#include <thread>

namespace dtrain::cli {

CLI::App* add_tokenize_subcommand(CLI::App& app, TokenizeFlags& flags) {
  auto* command = app.add_subcommand(
      "tokenize", "Train a subword tokenizer (SentencePiece BPE or unigram) on a text corpus and encode the corpus to a "
                  "token file for dtrain train --data tokens:PATH");
  command->add_option("--corpus", flags.corpus, "A text file, or a folder of text files")
      ->check(CLI::ExistingPath)->capture_default_str();
  command->add_option("--output", flags.output,
                      "PREFIX: writes PREFIX.model and PREFIX.vocab (the tokenizer) and PREFIX.bin (the corpus's ids, "
                      "llm.c's layout)")
      ->required();
  command->add_option("--vocab-size", flags.vocab_size, "Pieces at most (a small corpus may give fewer)")
      ->check(CLI::Range(int64_t{300}, int64_t{1} << 31))->capture_default_str();
  command->add_option("--type", flags.type, "bpe | unigram")->check(CLI::IsMember({"bpe", "unigram"}))
      ->capture_default_str();
  command->add_option("--tokenizer", flags.tokenizer, "Encode with this existing model instead of training one")
      ->check(CLI::ExistingFile);
  return command;
}

int tokenize_main(const TokenizeFlags& flags) {
  std::string model = flags.tokenizer;
  if (model.empty()) {
    const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    data::train_tokenizer(
        {.corpus = flags.corpus, .prefix = flags.output, .vocab_size = flags.vocab_size, .type = flags.type, .threads = threads});
    model = flags.output + ".model";
  }
  const data::Tokenizer tokenizer(model);
  const int64_t ids = data::encode_corpus(tokenizer, flags.corpus, flags.output + ".bin");
  std::cout << "tokenizer " << model << ": " << tokenizer.vocab_size() << " pieces\n"
            << "wrote " << flags.output << ".bin: " << ids << " ids\n"
            << "train on it: dtrain train --model llama --data tokens:" << flags.output << ".bin --vocab-size "
            << tokenizer.vocab_size() << " --tokenizer " << model << "\n";
  return 0;
}

}  // namespace dtrain::cli
