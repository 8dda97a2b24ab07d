// dtrain/tokenizer.h: SentencePiece tokenizers trained on a corpus, lossless
// round trips, and the token file they write read back by read_token_file.
#include <dtrain/data.h>
#include <dtrain/tokenizer.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace {

namespace fs = std::filesystem;

// A corpus with repeated words (something to merge), two-byte UTF-8 and tabs.
std::string corpus() {
  std::string text;
  const char* lines[] = {"the quick brown fox jumps over the lazy dog", "caf\xc3\xa9 au lait,\tthe usual",
                         "a fox, a dog and the  brown  cat", "numbers 1234 and 56789 repeat: 1234"};
  for (int i = 0; i < 300; ++i) text += std::string(lines[i % 4]) + " " + std::to_string(i % 17) + "\n";
  return text;
}

class Tokenizers : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = fs::temp_directory_path() / ("dtrain_tokenizer_" + std::to_string(::getpid()));
    fs::create_directories(folder_);
    std::ofstream(folder_ / "corpus.txt") << corpus();
  }
  void TearDown() override { fs::remove_all(folder_); }
  std::string path(const std::string& name) const { return (folder_ / name).string(); }
  fs::path folder_;
};

TEST_F(Tokenizers, TrainEncodeDecodeIsLossless) {
  for (const std::string type : {"bpe", "unigram"}) {
    dtrain::data::train_tokenizer({.corpus = path("corpus.txt"), .prefix = path(type), .vocab_size = 400, .type = type});
    const dtrain::data::Tokenizer tokenizer(path(type) + ".model");
    EXPECT_LE(tokenizer.vocab_size(), 400) << type;
    EXPECT_GT(tokenizer.vocab_size(), 259) << type;  // the 256 bytes, the specials, and subwords
    // Newlines, tabs, runs of spaces, characters the corpus never showed: all come back.
    for (const std::string& text : {std::string("the quick brown fox\n"), std::string("  two  spaces\tand a tab\n\n"),
                                   std::string("caf\xc3\xa9 \xe2\x82\xac 42 \xf0\x9f\x98\x80 unseen"),
                                   std::string(" leading space"), corpus()}) {
      const auto ids = tokenizer.encode(text);
      EXPECT_EQ(tokenizer.decode(ids), text) << type;
    }
    // Subwords: a frequent word is fewer pieces than letters.
    EXPECT_LT(tokenizer.encode("the quick brown fox").size(), std::string("the quick brown fox").size()) << type;
    EXPECT_THROW(tokenizer.decode({0, tokenizer.vocab_size()}), std::invalid_argument);
  }
}

TEST_F(Tokenizers, CorpusEncodesToAnLlmcTokenFile) {
  dtrain::data::train_tokenizer({.corpus = path("corpus.txt"), .prefix = path("t"), .vocab_size = 350});
  const dtrain::data::Tokenizer tokenizer(path("t.model"));
  const int64_t count = dtrain::data::encode_corpus(tokenizer, path("corpus.txt"), path("t.bin"));
  const auto file = dtrain::data::read_token_file(path("t.bin"));
  EXPECT_EQ(file.layout, "llm.c uint16");
  ASSERT_EQ(file.tokens.numel(), count);
  std::vector<int64_t> ids(file.tokens.data_ptr<int32_t>(), file.tokens.data_ptr<int32_t>() + count);
  EXPECT_EQ(tokenizer.decode(ids), corpus());
  EXPECT_FALSE(fs::exists(path("t.bin.tmp")));
}

TEST_F(Tokenizers, BadInputIsNamed) {
  EXPECT_THROW(dtrain::data::Tokenizer(path("missing.model")), std::invalid_argument);
  std::ofstream(path("not.model")) << "not a model";
  try {
    dtrain::data::Tokenizer tokenizer(path("not.model"));
    FAIL() << "a file that is not a model loaded";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("not.model"), std::string::npos) << error.what();
  }
  EXPECT_THROW(dtrain::data::train_tokenizer({.corpus = path("corpus.txt"), .prefix = path("x"), .vocab_size = 100}),
               std::invalid_argument);
  EXPECT_THROW(dtrain::data::train_tokenizer({.corpus = path("corpus.txt"), .prefix = path("x"), .type = "wordpiece"}),
               std::invalid_argument);
}

}  // namespace
