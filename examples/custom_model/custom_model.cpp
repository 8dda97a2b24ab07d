// A model and a dataset dtrain has never seen, trained with everything
// `dtrain train` does: this program is a dtrain whose --model resnet is the
// residual CNN below, on Fashion-MNIST with a random crop of its own.
//   custom_model train --model resnet --strategy fsdp --nproc 2 --steps 100 --checkpoint-dir ck
//   custom_model train --model resnet --model-option batch_norm=local ...   (plain BatchNorm)
#include <dtrain/cli.h>
#include <dtrain/data.h>
#include <dtrain/model_spec.h>
#include <dtrain/sync_batch_norm.h>
#include <dtrain/train.h>

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

namespace {

// SyncBatchNorm (statistics over the global batch, so that every layout
// equals one process; the trainer gives it the data-parallel group) or
// LibTorch's BatchNorm2d (each rank's own part); the same parameter and
// buffer names either way, so checkpoints interchange.
torch::nn::AnyModule batch_norm(int64_t channels, bool sync) {
  if (sync) return torch::nn::AnyModule(dtrain::SyncBatchNorm(channels));
  return torch::nn::AnyModule(torch::nn::BatchNorm2d(channels));
}

// conv-norm-relu-conv-norm, plus the input.
struct ResidualBlockImpl : torch::nn::Module {
  ResidualBlockImpl(int64_t channels, bool sync)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 3).padding(1).bias(false)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 3).padding(1).bias(false)))) {
    norm1 = batch_norm(channels, sync);
    norm2 = batch_norm(channels, sync);
    register_module("norm1", norm1.ptr());
    register_module("norm2", norm2.ptr());
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::relu(norm1.forward(conv1(x)));
    return torch::relu(x + norm2.forward(conv2(y)));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::AnyModule norm1, norm2;
};
TORCH_MODULE(ResidualBlock);

// A stem, `blocks` residual blocks at 14x14, global average pooling, 10 classes.
struct ResNetImpl : torch::nn::Module {
  ResNetImpl(int64_t channels, int64_t blocks, bool sync)
      : stem(register_module("stem", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, channels, 3).stride(2).padding(1)))),
        body(register_module("body", torch::nn::Sequential())),
        head(register_module("head", torch::nn::Linear(channels, 10))) {
    for (int64_t i = 0; i < blocks; ++i) body->push_back(ResidualBlock(channels, sync));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = body->forward(torch::relu(stem(x)));
    return head(y.mean({2, 3}));
  }
  torch::nn::Conv2d stem;
  torch::nn::Sequential body;
  torch::nn::Linear head;
};
TORCH_MODULE(ResNet);

// Fashion-MNIST, each training image padded by 2 and cropped back to 28x28 at
// an offset drawn from a generator seeded by (seed, index): the same crop for a
// sample on any rank, at any world size and after --resume.
class CroppedFashionMNIST : public dtrain::data::Dataset {
 public:
  CroppedFashionMNIST(dtrain::data::Split split, const std::string& dir, uint64_t seed, bool crop)
      : images_(split, dir), seed_(seed), crop_(crop) {}
  int64_t size() const override { return images_.size(); }
  dtrain::data::Batch get_batch(const std::vector<int64_t>& indices) const override {
    dtrain::data::Batch batch = images_.get_batch(indices);
    if (!crop_) return batch;
    auto padded = torch::constant_pad_nd(batch.inputs, {2, 2, 2, 2}, 0.0);
    for (size_t i = 0; i < indices.size(); ++i) {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(seed_ * 1000003 + static_cast<uint64_t>(indices[i]));
      auto offset = torch::randint(0, 5, {2}, generator, torch::kInt64);
      const int64_t dy = offset[0].item<int64_t>(), dx = offset[1].item<int64_t>();
      batch.inputs[static_cast<int64_t>(i)] = padded[static_cast<int64_t>(i)].slice(1, dy, dy + 28).slice(2, dx, dx + 28);
    }
    return batch;
  }

 private:
  dtrain::data::FashionMNIST images_;
  uint64_t seed_;
  bool crop_;
};

std::string option(const dtrain::TrainConfig& c, const std::string& key, const std::string& otherwise) {
  const auto found = c.model_options.find(key);
  return found == c.model_options.end() ? otherwise : found->second;
}

dtrain::ModelSpec resnet_spec() {
  dtrain::ModelSpec spec;
  spec.summary = "a residual CNN with BatchNorm (examples/custom_model; --model-option channels=N,blocks=N,batch_norm=sync|local)";
  spec.build = [](const dtrain::TrainConfig& c) {
    return dtrain::built_model(ResNet(std::stoll(option(c, "channels", "8")), std::stoll(option(c, "blocks", "2")),
                                      option(c, "batch_norm", "sync") == "sync"));
  };
  spec.check = [](const dtrain::TrainConfig& c) {
    const std::string norm = option(c, "batch_norm", "sync");
    if (norm != "sync" && norm != "local")
      throw std::invalid_argument("--model-option batch_norm=" + norm + " is not sync or local");
  };
  spec.data = [](const dtrain::TrainConfig& c) {
    dtrain::ModelData data;
    data.train = std::make_shared<CroppedFashionMNIST>(dtrain::data::Split::Train, c.fashion_mnist_dir, c.seed, true);
    data.validation =
        std::make_shared<CroppedFashionMNIST>(dtrain::data::Split::Validation, c.fashion_mnist_dir, c.seed, false);
    data.description = "Fashion-MNIST with random 28x28 crops of the 2-padded images";
    return data;
  };
  return spec;
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::register_model("resnet", resnet_spec());
  return dtrain::cli::main(argc, argv);
}
