// Your own model and data with every feature of `dtrain train`: a model spec
// and dtrain::Trainer. Run: dtrain launch -n 2 -- build/bin/example_your_model [steps [checkpoint-dir]]
#include <dtrain/comm.h>
#include <dtrain/data.h>
#include <dtrain/model_spec.h>
#include <dtrain/trainer.h>

#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <memory>

// Any LibTorch module: here a small convolutional network for 28x28 images.
struct TinyNetImpl : torch::nn::Module {
  TinyNetImpl()
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5).stride(2)))),
        head(register_module("head", torch::nn::Linear(16 * 12 * 12, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head(torch::relu(conv(x)).flatten(1)); }
  torch::nn::Conv2d conv;
  torch::nn::Linear head;
};
TORCH_MODULE(TinyNet);

int main(int argc, char** argv) {
  auto world = dtrain::init(argc, argv);  // mpirun, torchrun, dtrain launch or one process

  dtrain::ModelSpec spec;  // how to build the model and what it trains on
  spec.name = "tinynet";
  spec.build = [](const dtrain::TrainConfig&) { return dtrain::built_model(TinyNet()); };
  spec.data = [](const dtrain::TrainConfig& config) {  // any dtrain::data::Dataset
    dtrain::ModelData data;
    data.train = std::make_shared<dtrain::data::FashionMNIST>(dtrain::data::Split::Train, config.fashion_mnist_dir);
    data.validation = std::make_shared<dtrain::data::FashionMNIST>(dtrain::data::Split::Validation,
                                                                   config.fashion_mnist_dir);
    return data;
  };

  dtrain::TrainConfig config;  // everything dtrain train's flags say (dtrain/train.h)
  config.strategy = "fsdp";
  config.steps = argc > 1 ? std::atoi(argv[1]) : 200;
  config.batch_size = 128;
  config.optimizer = "adamw";
  config.lr = 1e-3;
  if (argc > 2) {  // saved every 50 steps, and on Ctrl-C; run again to continue
    config.checkpoint_dir = argv[2];
    config.checkpoint_every = 50;
    config.resume = true;
  }
  const dtrain::TrainResult result = dtrain::Trainer(config, spec).run(world);
  if (world->rank() == 0) std::cout << "your model: test accuracy " << *result.eval_accuracy << std::endl;
}
