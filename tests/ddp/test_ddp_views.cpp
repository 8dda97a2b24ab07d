// Gradients as bucket views (DDPOptions::gradient_as_bucket_view, the
// default): .grad becomes the bucket after zero_grad() with set_to_none,
// stays it with zero_grad(false), and falls back to copies, per parameter,
// where a gradient cannot be a view; training equals single-process
// training in every case.
#include <dtrain/ddp.h>

#include "../common/multirank_gtest.h"
#include "ddp_test_support.h"

#include <gtest/gtest.h>

#include <set>

namespace {

using dtrain::testing::world;
using dtrain::testing::world_ptr;
using namespace ddp_test;

torch::Tensor loss_on(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::cross_entropy_loss(logits, targets);
}

size_t distinct_storages(const std::vector<torch::Tensor>& parameters) {
  std::set<const void*> storages;
  for (const auto& p : parameters) storages.insert(p.grad().storage().data());
  return storages.size();
}

// Trains `steps` SGD steps with momentum on the global batches through DDP
// and on one process; returns the largest parameter difference.
template <class Model>
double train_both(int steps, bool set_to_none, const dtrain::DDPOptions& options, Model* replica_out = nullptr) {
  auto reference = make_model<Model>(13);
  torch::optim::SGD reference_optimizer(reference->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto replica = make_model<Model>(13);
  auto ddp = dtrain::DistributedDataParallel(replica, world_ptr(), options);
  torch::optim::SGD optimizer(replica->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < steps; ++step) {
    const auto batch = global_batch(step, 12);
    reference_optimizer.zero_grad(set_to_none);
    loss_on(reference->forward(batch.inputs), batch.targets).backward();
    reference_optimizer.step();
    const auto mine = local_part(batch, world());
    optimizer.zero_grad(set_to_none);
    loss_on(ddp(mine.inputs), mine.targets).backward();
    optimizer.step();
  }
  if (replica_out) *replica_out = replica;
  return max_abs_difference(replica->parameters(), reference->parameters());
}

TEST(Views, AreTheDefault) { EXPECT_TRUE(dtrain::DDPOptions{}.gradient_as_bucket_view); }

// zero_grad() (set_to_none) leaves .grad undefined: backward makes a fresh
// gradient, DDP copies it in once and .grad becomes the bucket again.
TEST(Views, SetToNoneAndZeroedViewsBothTrainLikeOneProcess) {
  for (bool set_to_none : {true, false}) {
    TinyMLP replica{nullptr};
    EXPECT_LE(train_both<TinyMLP>(5, set_to_none, {}, &replica), 1e-5) << "set_to_none " << set_to_none;
    EXPECT_EQ(distinct_storages(replica->parameters()), 1u) << "one bucket: every .grad a slice of it";
  }
}

TEST(Views, CopiesWhenTurnedOff) {
  dtrain::DDPOptions options;
  options.gradient_as_bucket_view = false;
  TinyMLP replica{nullptr};
  EXPECT_LE(train_both<TinyMLP>(5, true, options, &replica), 1e-5);
  EXPECT_EQ(distinct_storages(replica->parameters()), replica->parameters().size());
}

// A user's .grad that cannot be a view (not contiguous) is kept: backward
// adds to it, DDP copies it in and the average back out.
TEST(Views, AnAssignedGradientThatCannotBeAViewIsKept) {
  const auto batch = global_batch(3, 12);
  auto reference = make_model<TinyMLP>(4);
  auto replica = make_model<TinyMLP>(4);
  auto ddp = dtrain::DistributedDataParallel(replica, world_ptr());
  auto assign = [](TinyMLP& model) {
    auto& weight = model->fc2->weight;
    weight.mutable_grad() = torch::full({weight.size(1), weight.size(0)}, 0.5).t();  // non-contiguous
    model->fc1->weight.mutable_grad() = torch::full_like(model->fc1->weight, -0.25);  // contiguous
  };
  assign(reference);
  assign(replica);
  const auto kept = replica->fc2->weight.grad();
  loss_on(reference->forward(batch.inputs), batch.targets).backward();
  const auto mine = local_part(batch, world());
  loss_on(ddp(mine.inputs), mine.targets).backward();
  EXPECT_LE(max_abs_difference(gradients_of(replica->parameters()), gradients_of(reference->parameters())), 1e-6);
  EXPECT_TRUE(replica->fc2->weight.grad().is_same(kept)) << "the non-contiguous gradient stays the user's tensor";
  EXPECT_EQ(replica->fc1->weight.grad().storage().data(), replica->fc3->bias.grad().storage().data())
      << "a contiguous assigned gradient is replaced by its view";
}

// A parameter stored transposed (non-contiguous): AccumulateGrad gives its
// gradient the same strides, which a contiguous slot cannot have, so this
// parameter alone is copied in and out.
struct TransposedImpl : torch::nn::Module {
  TransposedImpl() {
    fc = register_module("fc", torch::nn::Linear(kImage * kImage, 16));
    out = register_parameter("out", (torch::randn({kClasses, 16}) * 0.1).t());
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(fc(x.flatten(1))).matmul(out); }
  torch::nn::Linear fc{nullptr};
  torch::Tensor out;
};
TORCH_MODULE(Transposed);

TEST(Views, ANonContiguousParameterFallsBackToCopies) {
  Transposed replica{nullptr};
  EXPECT_LE(train_both<Transposed>(5, true, {}, &replica), 1e-5);
  EXPECT_FALSE(replica->out.is_contiguous()) << "the test's premise";
  EXPECT_NE(replica->out.grad().storage().data(), replica->fc->weight.grad().storage().data());
  EXPECT_EQ(replica->fc->bias.grad().storage().data(), replica->fc->weight.grad().storage().data());
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
