// FashionMNIST (include/dtrain/data.h): the real files, and synthetic broken
// ones that must each give an error naming the file and the problem.
#include <dtrain/data.h>

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using dtrain::data::FashionMNIST;
using dtrain::data::Split;

// ---------------------------------------------------------------- real files

TEST(FashionMNIST, TrainSet) {
  FashionMNIST train(Split::Train);
  ASSERT_EQ(train.size(), 60000);
  EXPECT_EQ(train.images().sizes(), (std::vector<int64_t>{60000, 1, 28, 28}));
  EXPECT_EQ(train.images().scalar_type(), torch::kFloat);
  EXPECT_EQ(train.labels().scalar_type(), torch::kLong);
  EXPECT_EQ(train.labels().min().item<int64_t>(), 0);
  EXPECT_EQ(train.labels().max().item<int64_t>(), 9);
  // Balanced classes, 6000 each, as published.
  EXPECT_TRUE(torch::equal(torch::bincount(train.labels()), torch::full({10}, 6000, torch::kLong)));
  // Normalised with the train set's own mean and standard deviation.
  EXPECT_NEAR(train.images().mean().item<double>(), 0.0, 1e-3);
  EXPECT_NEAR(train.images().std().item<double>(), 1.0, 1e-3);

  auto batch = train.get_batch({59999, 0, 17});
  EXPECT_EQ(batch.inputs.sizes(), (std::vector<int64_t>{3, 1, 28, 28}));
  EXPECT_TRUE(torch::equal(batch.inputs[0], train.images()[59999]));
  EXPECT_TRUE(torch::equal(batch.inputs[2], train.images()[17]));
  EXPECT_EQ(batch.targets[1].item<int64_t>(), train.labels()[0].item<int64_t>());
  EXPECT_THROW(train.get_batch({60000}), std::out_of_range);
  EXPECT_THROW(train.get_batch({-1}), std::out_of_range);
}

TEST(FashionMNIST, ValidationSetIsT10k) {
  FashionMNIST test(Split::Validation);
  ASSERT_EQ(test.size(), 10000);
  EXPECT_TRUE(torch::equal(torch::bincount(test.labels()), torch::full({10}, 1000, torch::kLong)));
}

// ----------------------------------------------------------- synthetic files

class SyntheticFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dtrain-fmnist-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string images_path() const { return (dir_ / "train-images-idx3-ubyte.gz").string(); }
  std::string labels_path() const { return (dir_ / "train-labels-idx1-ubyte.gz").string(); }

  static std::vector<uint8_t> header(uint32_t magic, const std::vector<uint32_t>& dims) {
    std::vector<uint8_t> bytes;
    auto put = [&](uint32_t v) {
      for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>(v >> shift));
    };
    put(magic);
    for (auto d : dims) put(d);
    return bytes;
  }
  static std::vector<uint8_t> images(uint32_t n, uint32_t rows = 28, uint32_t cols = 28, uint32_t body_images = ~0u) {
    auto bytes = header(0x803, {n, rows, cols});
    const uint32_t count = body_images == ~0u ? n : body_images;
    for (uint32_t i = 0; i < count * rows * cols; ++i) bytes.push_back(static_cast<uint8_t>(i % 256));
    return bytes;
  }
  static std::vector<uint8_t> labels(const std::vector<uint8_t>& values) {
    auto bytes = header(0x801, {static_cast<uint32_t>(values.size())});
    bytes.insert(bytes.end(), values.begin(), values.end());
    return bytes;
  }
  static void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
    gzFile file = gzopen(path.c_str(), "wb");
    ASSERT_NE(file, nullptr);
    ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
    ASSERT_EQ(gzclose(file), Z_OK);
  }
  static std::vector<char> read_raw(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  static void write_raw(const std::string& path, const std::vector<char>& bytes) {
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  // The message of the error loading dir_, or "no error".
  std::string load_error() const {
    try {
      FashionMNIST dataset(Split::Train, dir_.string());
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "no error";
  }

  fs::path dir_;
};

#define EXPECT_CONTAINS(text, part) EXPECT_NE((text).find(part), std::string::npos) << "message: " << (text)

TEST_F(SyntheticFiles, ValidFilesLoadAndNormalise) {
  write_gz(images_path(), images(3));
  write_gz(labels_path(), labels({0, 9, 4}));
  FashionMNIST dataset(Split::Train, dir_.string());
  ASSERT_EQ(dataset.size(), 3);
  EXPECT_EQ(dataset.labels()[1].item<int64_t>(), 9);
  // Pixel 255 is image 0's row 9, column 3 (i % 256 with i = 255).
  EXPECT_NEAR(dataset.images()[0][0][9][3].item<float>(), (1.0 - 0.2860) / 0.3530, 1e-5);
  EXPECT_NEAR(dataset.images()[0][0][0][0].item<float>(), (0.0 - 0.2860) / 0.3530, 1e-5);
}

TEST_F(SyntheticFiles, TruncatedBody) {
  write_gz(images_path(), images(3, 28, 28, /*body_images=*/2));
  write_gz(labels_path(), labels({0, 1, 2}));
  EXPECT_CONTAINS(load_error(), images_path() + ": truncated: header promises 2352 bytes of pixels, file has 1568");
}

TEST_F(SyntheticFiles, TruncatedGzipStream) {
  write_gz(images_path(), images(20));
  auto raw = read_raw(images_path());
  raw.resize(raw.size() / 2);
  write_raw(images_path(), raw);
  write_gz(labels_path(), labels(std::vector<uint8_t>(20, 1)));
  const auto error = load_error();
  EXPECT_CONTAINS(error, images_path() + ": truncated: header promises 15680 bytes of pixels, file has ");
  EXPECT_CONTAINS(error, "the gzip stream ends early");
}

TEST_F(SyntheticFiles, CorruptGzipData) {
  write_gz(images_path(), images(3));
  auto raw = read_raw(images_path());
  raw[raw.size() - 6] ^= 0x5a;  // the CRC-32 of the uncompressed data
  write_raw(images_path(), raw);
  write_gz(labels_path(), labels({0, 1, 2}));
  EXPECT_CONTAINS(load_error(), images_path() + ": corrupt gzip data (zlib: ");
}

TEST_F(SyntheticFiles, BadMagic) {
  write_gz(images_path(), labels({0, 1, 2}));  // a labels file where images belong
  write_gz(labels_path(), labels({0, 1, 2}));
  EXPECT_CONTAINS(load_error(),
                  images_path() + ": bad magic number 0x00000801, expected 0x00000803 (IDX, unsigned bytes, 3 "
                                  "dimensions): this is not a file of pixels, or it is corrupt");
}

TEST_F(SyntheticFiles, HeaderDimensionMismatch) {
  write_gz(images_path(), images(3, 28, 27));
  write_gz(labels_path(), labels({0, 1, 2}));
  EXPECT_CONTAINS(load_error(), images_path() + ": header gives dimensions 3x28x27, expected Nx28x28");
}

TEST_F(SyntheticFiles, LabelCountDiffersFromImageCount) {
  write_gz(images_path(), images(3));
  write_gz(labels_path(), labels({0, 1}));
  EXPECT_CONTAINS(load_error(), labels_path() + ": header gives 2 labels, but " + images_path() + " holds 3 images");
}

TEST_F(SyntheticFiles, BytesBeyondWhatTheHeaderPromises) {
  auto bytes = images(2);
  bytes.push_back(7);
  write_gz(images_path(), bytes);
  write_gz(labels_path(), labels({0, 1}));
  EXPECT_CONTAINS(load_error(), images_path() + ": header promises 1568 bytes of pixels, file has 1 bytes more");
}

TEST_F(SyntheticFiles, HeaderCutShort) {
  write_gz(images_path(), {0, 0, 8, 3, 0, 0});
  write_gz(labels_path(), labels({0}));
  EXPECT_CONTAINS(load_error(), images_path() + ": truncated: file ends inside the IDX header (6 of 16 header bytes)");
}

TEST_F(SyntheticFiles, LabelOutOfRange) {
  write_gz(images_path(), images(3));
  write_gz(labels_path(), labels({0, 10, 2}));
  EXPECT_CONTAINS(load_error(), labels_path() + ": label 10 at index 1 is outside 0..9");
}

TEST_F(SyntheticFiles, MissingFile) {
  write_gz(images_path(), images(1));
  EXPECT_CONTAINS(load_error(), "Fashion-MNIST file " + labels_path() + " is missing");
}

TEST(FashionMNISTErrors, MissingDirectorySaysWhatToInstall) {
  try {
    FashionMNIST dataset(Split::Train, "/nonexistent/fashion-mnist");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    EXPECT_CONTAINS(message, "Fashion-MNIST directory /nonexistent/fashion-mnist does not exist");
    EXPECT_CONTAINS(message, "dataset-fashion-mnist");
    EXPECT_CONTAINS(message, "scripts/setup");
  }
}

}  // namespace
