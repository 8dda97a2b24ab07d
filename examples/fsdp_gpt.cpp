// Fully sharded training of a small GPT on the fortunes corpus: each rank
// holds 1/N of the parameters, gradients and AdamW state.
// Run: dtrain launch -n 2 -- build/bin/example_fsdp [steps]
#include <dtrain/comm.h>
#include <dtrain/data.h>
#include <dtrain/fsdp.h>
#include <dtrain/models.h>

#include <torch/torch.h>

#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
  auto world = dtrain::init(argc, argv);
  const int steps = argc > 1 ? std::atoi(argv[1]) : 100;

  torch::manual_seed(0);
  dtrain::models::GPTConfig config{.seq_len = 64, .n_layer = 4, .n_embd = 128, .n_head = 4};
  dtrain::models::GPT model{nullptr};  // its blocks are dtrain::Sharded<GPTBlock> units
  {
    dtrain::DeferredConstruction deferred;  // no weights yet: fully_shard builds each unit into its shards
    model = dtrain::models::GPT(config);
  }
  auto fsdp = dtrain::fully_shard(model, world, {.strategy = dtrain::Sharding::Full});
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));  // shards

  const auto corpus = dtrain::data::read_text_corpus();  // /usr/share/games/fortunes
  dtrain::data::TextDataset train(corpus, dtrain::data::Split::Train, {.seq_len = config.seq_len});
  dtrain::data::DistributedSampler sampler({.dataset_size = train.size(), .global_batch_size = 16,
                                            .world_size = world->size(), .rank = world->rank(), .seed = 1});
  for (int step = 0; step < steps; ++step) {
    auto batch = train.get_batch(sampler.local_batch(step));
    optimizer.zero_grad();
    auto logits = fsdp(batch.inputs);  // each block gathered just before it runs
    auto loss = torch::cross_entropy_loss(logits.flatten(0, 1), batch.targets.flatten());
    loss.backward();                     // gradients reduce-scattered block by block
    dtrain::clip_grad_norm(fsdp, 1.0);   // global norm over the shards
    optimizer.step();                    // each rank updates its shard
    if (world->rank() == 0 && (step % 25 == 0 || step + 1 == steps))
      std::cout << "step " << step << " loss " << loss.item<double>() << std::endl;
  }
}
