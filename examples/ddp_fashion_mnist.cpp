// Data-parallel training of an MLP on Fashion-MNIST with dtrain's DDP.
// Run: dtrain launch -n 2 -- build/bin/example_ddp [steps]
#include <dtrain/comm.h>
#include <dtrain/data.h>
#include <dtrain/ddp.h>
#include <dtrain/models.h>

#include <torch/torch.h>

#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
  auto world = dtrain::init(argc, argv);  // mpirun, torchrun or one process
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;

  torch::manual_seed(0);
  dtrain::models::MLP model(std::vector<int64_t>{256, 256});
  auto ddp = dtrain::DistributedDataParallel(model, world);  // rank 0's weights everywhere
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  dtrain::data::FashionMNIST train(dtrain::data::Split::Train);
  dtrain::data::DistributedSampler sampler({.dataset_size = train.size(), .global_batch_size = 128,
                                            .world_size = world->size(), .rank = world->rank(), .seed = 1});
  for (int step = 0; step < steps; ++step) {
    auto batch = train.get_batch(sampler.local_batch(step));  // this rank's part
    optimizer.zero_grad();
    auto loss = torch::cross_entropy_loss(ddp(batch.inputs), batch.targets);
    loss.backward();                                // gradients averaged during backward
    dtrain::clip_grad_norm(ddp, /*max_norm=*/1.0);  // global norm
    optimizer.step();
    if (world->rank() == 0 && (step % 50 == 0 || step + 1 == steps))
      std::cout << "step " << step << " loss " << loss.item<double>() << std::endl;
  }
}
