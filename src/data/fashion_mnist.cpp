#include "dtrain/data.h"

#include "data/batch_index.h"
#include "data/idx_file.h"

#include <filesystem>
#include <stdexcept>

namespace dtrain::data {

namespace {

constexpr int64_t kSide = 28;
constexpr int64_t kClasses = 10;
// Mean and standard deviation of the train set's pixels (scaled to [0, 1]),
// the usual Fashion-MNIST normalisation: inputs come out near mean 0, std 1.
constexpr double kMean = 0.2860;
constexpr double kStd = 0.3530;

const char* kInstallHint =
    "install the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist) or run scripts/setup";

std::string existing_file(const std::filesystem::path& dir, const std::string& name) {
  auto path = dir / name;
  if (!std::filesystem::exists(path))
    throw std::runtime_error("Fashion-MNIST file " + path.string() + " is missing: " + kInstallHint);
  return path.string();
}

}  // namespace

FashionMNIST::FashionMNIST(Split split, const std::string& dir) {
  if (!std::filesystem::is_directory(dir))
    throw std::runtime_error("Fashion-MNIST directory " + dir + " does not exist: " + kInstallHint);
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  const auto images_path = existing_file(dir, prefix + "-images-idx3-ubyte.gz");
  const auto labels_path = existing_file(dir, prefix + "-labels-idx1-ubyte.gz");

  // A damaged file in the packaged folder is fixed by reinstalling the package.
  const std::string fix = dir == kFashionMNISTDir ? "; reinstall: apt-get install --reinstall dataset-fashion-mnist" : "";
  torch::Tensor pixels, labels;
  try {
    pixels = read_idx_ubyte(images_path, {-1, kSide, kSide}, "pixels");
    labels = read_idx_ubyte(labels_path, {-1}, "labels");
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(e.what() + fix);
  }
  if (labels.size(0) != pixels.size(0))
    throw std::runtime_error(labels_path + ": header gives " + std::to_string(labels.size(0)) + " labels, but " +
                             images_path + " holds " + std::to_string(pixels.size(0)) + " images" + fix);
  if (labels.numel() > 0) {
    const auto max_label = labels.max().item<int64_t>();
    if (max_label >= kClasses) {
      const auto at = labels.argmax().item<int64_t>();
      throw std::runtime_error(labels_path + ": label " + std::to_string(max_label) + " at index " +
                               std::to_string(at) + " is outside 0..9" + fix);
    }
  }

  images_ = pixels.unsqueeze(1).to(torch::kFloat).div_(255.0).sub_(kMean).div_(kStd);
  labels_ = labels.to(torch::kLong);
}

int64_t FashionMNIST::size() const { return labels_.size(0); }

Batch FashionMNIST::get_batch(const std::vector<int64_t>& indices) const {
  auto index = batch_index(indices, size(), "FashionMNIST");
  return {images_.index_select(0, index), labels_.index_select(0, index)};
}

}  // namespace dtrain::data
