// Text corpora and byte windows (include/dtrain/data.h).
#include <dtrain/data.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using dtrain::data::read_text_corpus;
using dtrain::data::Split;
using dtrain::data::TextCorpus;
using dtrain::data::TextDataset;
using dtrain::data::TextOptions;

#define EXPECT_CONTAINS(text, part) EXPECT_NE((text).find(part), std::string::npos) << "message: " << (text)

std::string as_string(const torch::Tensor& bytes) {
  auto contiguous = bytes.contiguous();
  return std::string(reinterpret_cast<const char*>(contiguous.data_ptr<uint8_t>()), contiguous.numel());
}

class TextFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dtrain-text-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& content) {
    auto path = dir_ / name;
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << content;
    return path.string();
  }

  template <class F>
  static std::string error_of(F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "no error";
  }

  fs::path dir_;
};

TEST_F(TextFiles, FolderReadsTextFilesInPathOrderAndSkipsBinaryDatAndLinks) {
  write("b/second.txt", "second file\n");
  write("a.txt", "first file\n");
  write("fortune.dat", "looks like text but .dat is fortune's index\n");
  write("c.bin", std::string("bin\0ary", 7));
  write("d.ctl", std::string(100, '\x01') + "mostly control characters");
  fs::create_symlink(dir_ / "a.txt", dir_ / "a.u8");  // as fortune installs foo.u8 -> foo

  const auto corpus = read_text_corpus(dir_.string());
  EXPECT_EQ(as_string(corpus.bytes), "first file\nsecond file\n");
  EXPECT_EQ(corpus.files, (std::vector<std::string>{(dir_ / "a.txt").string(), (dir_ / "b/second.txt").string()}));
  EXPECT_EQ(corpus.skipped, (std::vector<std::string>{(dir_ / "c.bin").string(), (dir_ / "d.ctl").string(),
                                                      (dir_ / "fortune.dat").string()}));
}

TEST_F(TextFiles, WindowsAreInputsAndInputsShiftedByOne) {
  std::string text;
  for (int i = 0; i < 100; ++i) text += static_cast<char>('A' + i % 26);
  const auto corpus = read_text_corpus(write("corpus.txt", text));

  TextOptions options;
  options.seq_len = 8;
  TextDataset train(corpus, Split::Train, options);  // bytes 0..89
  TextDataset validation(corpus, Split::Validation, options);  // bytes 90..99
  EXPECT_EQ(as_string(train.bytes()), text.substr(0, 90));
  EXPECT_EQ(as_string(validation.bytes()), text.substr(90));
  EXPECT_EQ(train.size(), (90 - 8 - 1) / 8 + 1);  // 11 windows with stride seq_len
  EXPECT_EQ(validation.size(), 1);

  const auto batch = train.get_batch({10, 0, 3});
  ASSERT_EQ(batch.inputs.sizes(), (std::vector<int64_t>{3, 8}));
  ASSERT_EQ(batch.targets.sizes(), (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(batch.inputs.scalar_type(), torch::kLong);
  EXPECT_EQ(batch.targets.scalar_type(), torch::kLong);
  const std::vector<int64_t> starts = {80, 0, 24};
  for (int64_t row = 0; row < 3; ++row)
    for (int64_t t = 0; t < 8; ++t) {
      EXPECT_EQ(batch.inputs[row][t].item<int64_t>(), static_cast<unsigned char>(text[starts[row] + t]));
      EXPECT_EQ(batch.targets[row][t].item<int64_t>(), static_cast<unsigned char>(text[starts[row] + t + 1]));
    }
  EXPECT_THROW(train.get_batch({11}), std::out_of_range);

  options.stride = 1;  // every window whose target fits: starts 0..81
  TextDataset dense(corpus, Split::Train, options);
  EXPECT_EQ(dense.size(), 82);
  const auto last = dense.get_batch({81});
  EXPECT_EQ(last.targets[0][7].item<int64_t>(), static_cast<unsigned char>(text[89]));
}

TEST_F(TextFiles, ClearErrors) {
  EXPECT_CONTAINS(error_of([&] { read_text_corpus((dir_ / "missing").string()); }),
                  "text corpus " + (dir_ / "missing").string() + " does not exist");
  EXPECT_CONTAINS(error_of([&] { read_text_corpus((dir_ / "missing").string()); }), "Debian package fortunes");
  EXPECT_CONTAINS(error_of([&] { read_text_corpus(dir_.string()); }),
                  "text corpus folder " + dir_.string() + " has no text files (0 skipped as binary or .dat)");
  write("only.dat", "index");
  EXPECT_CONTAINS(error_of([&] { read_text_corpus(dir_.string()); }), "has no text files (1 skipped as binary or .dat)");
  const auto binary = write("x.bin", std::string("a\0b", 3));
  EXPECT_CONTAINS(error_of([&] { read_text_corpus(binary); }),
                  "text corpus " + binary + " is not a text file: it contains NUL bytes");
  const auto empty = write("empty.txt", "");
  EXPECT_CONTAINS(error_of([&] { read_text_corpus(empty); }), "text corpus " + empty + " is empty");

  const auto corpus = read_text_corpus(write("short.txt", std::string(50, 'x')));
  TextOptions options;
  options.seq_len = 8;
  EXPECT_CONTAINS(error_of([&] { TextDataset dataset(corpus, Split::Validation, options); }),
                  "the validation split has 5 bytes, fewer than seq_len + 1 = 9");
  options.validation_fraction = 1.5;
  EXPECT_CONTAINS(error_of([&] { TextDataset dataset(corpus, Split::Train, options); }),
                  "validation_fraction must be in (0, 1)");
}

TEST(TextCorpus, Fortunes) {
  const auto corpus = read_text_corpus();
  EXPECT_GT(corpus.bytes.numel(), 1'000'000);
  EXPECT_EQ(corpus.bytes.scalar_type(), torch::kUInt8);
  EXPECT_EQ((corpus.bytes == 0).sum().item<int64_t>(), 0);
  EXPECT_FALSE(corpus.skipped.empty());  // the .dat indexes
  for (const auto& file : corpus.files) {
    EXPECT_NE(fs::path(file).extension(), ".dat") << file;
    EXPECT_NE(fs::path(file).extension(), ".u8") << file << " is a link to a file already read";
  }
  TextDataset train(corpus, Split::Train, {.seq_len = 128});
  EXPECT_GT(train.size(), 1000);
}

}  // namespace
