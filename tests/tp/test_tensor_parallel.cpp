// Tensor parallelism (include/dtrain/tensor_parallel.h) and the device mesh
// (include/dtrain/mesh.h), at 1-4 ranks: every parallel layer equals its
// unsplit torch::nn counterpart built from the same seed, in values and in
// gradients (each rank's gradient is its slice of the full one).
#include <dtrain/mesh.h>
#include <dtrain/tensor_parallel.h>

#include "../common/multirank_gtest.h"

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/torch.h>

using dtrain::DeviceMesh;
using dtrain::testing::world;
using dtrain::testing::world_ptr;
namespace tp = dtrain::tp;

namespace {

// Tolerance for results that sum in another order than the unsplit layer.
void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double error = (actual - expected).abs().max().item<double>();
  EXPECT_LE(error, 1e-5 * (1.0 + expected.abs().max().item<double>())) << what << ": max |difference| " << error;
}

// The whole world as one tensor-parallel group.
DeviceMesh tp_mesh() { return DeviceMesh(world_ptr(), {{"dp", 1}, {"tp", -1}}); }

TEST(DeviceMesh, RowMajorWithTheLastDimensionInnermost) {
  const int n = world().size();
  for (int tp_size = 1; tp_size <= n; ++tp_size) {
    if (n % tp_size != 0) continue;
    DeviceMesh mesh(world_ptr(), {{"dp", -1}, {"tp", tp_size}});
    EXPECT_EQ(mesh.size("dp"), n / tp_size);
    EXPECT_EQ(mesh.size("tp"), tp_size);
    EXPECT_EQ(mesh.rank("tp"), world().rank() % tp_size);
    EXPECT_EQ(mesh.rank("dp"), world().rank() / tp_size);
    EXPECT_EQ(mesh.world_rank({mesh.rank("dp"), mesh.rank("tp")}), world().rank());
    EXPECT_EQ(mesh.comm("tp")->size(), tp_size);
    EXPECT_EQ(mesh.comm("tp")->rank(), mesh.rank("tp"));
    EXPECT_EQ(mesh.comm("dp")->rank(), mesh.rank("dp"));
    // The tp group is the consecutive world ranks of my dp row: their sum says so.
    torch::Tensor ranks = torch::tensor({static_cast<int64_t>(world().rank())});
    mesh.comm("tp")->blocking().all_reduce(ranks);
    const int64_t first = mesh.rank("dp") * tp_size;
    EXPECT_EQ(ranks.item<int64_t>(), tp_size * first + tp_size * (tp_size - 1) / 2);
    // The dp group: the ranks with my tp coordinate, tp_size apart.
    torch::Tensor column = torch::tensor({static_cast<int64_t>(world().rank())});
    mesh.comm("dp")->blocking().all_reduce(column);
    const int64_t dp = n / tp_size;
    EXPECT_EQ(column.item<int64_t>(), dp * mesh.rank("tp") + tp_size * dp * (dp - 1) / 2);
  }
}

TEST(DeviceMesh, BadShapesAreRejectedWithTheNumbers) {
  const int n = world().size();
  try {
    DeviceMesh mesh(world_ptr(), {{"dp", n}, {"tp", 2}});
    ADD_FAILURE() << "a mesh of " << 2 * n << " ranks on a world of " << n;
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("multiply to " + std::to_string(2 * n)), std::string::npos)
        << error.what();
  }
  EXPECT_THROW(DeviceMesh(world_ptr(), {{"dp", -1}, {"tp", n + 1}}), std::invalid_argument);
  EXPECT_THROW(DeviceMesh(world_ptr(), {{"tp", -1}, {"tp", 1}}), std::invalid_argument);
  EXPECT_THROW(DeviceMesh(world_ptr(), {{"dp", -1}, {"tp", 0}}), std::invalid_argument);
}

TEST(Collectives, CopyAndReduceAreEachOthersTranspose) {
  DeviceMesh mesh = tp_mesh();
  const auto& group = mesh.comm("tp");
  const int r = group->rank(), n = group->size();
  // copy_to_group: identity forward; backward sums the ranks' gradients.
  torch::Tensor x = torch::ones({3}, torch::requires_grad());
  torch::Tensor y = tp::copy_to_group(x, group);
  EXPECT_TRUE(torch::equal(y, torch::ones({3})));
  (y * static_cast<double>(r + 1)).sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({3}, n * (n + 1) / 2.0)));
  // reduce_from_group: sums forward; the gradient passes as it is.
  torch::Tensor a = torch::full({2}, static_cast<double>(r + 1), torch::requires_grad());
  torch::Tensor b = tp::reduce_from_group(a, group);
  EXPECT_TRUE(torch::equal(b, torch::full({2}, n * (n + 1) / 2.0)));
  (b * 3.0).sum().backward();
  EXPECT_TRUE(torch::equal(a.grad(), torch::full({2}, 3.0)));
}

TEST(Collectives, GatherAndSplitAlongTheLastDimension) {
  DeviceMesh mesh = tp_mesh();
  const auto& group = mesh.comm("tp");
  const int r = group->rank(), n = group->size();
  const torch::Tensor full = torch::arange(2 * 3 * 4 * n, torch::kFloat32).view({2, 3, 4 * n});
  torch::Tensor piece = full.narrow(-1, 4 * r, 4).clone().requires_grad_();
  torch::Tensor gathered = tp::gather_last_dim(piece, group);
  EXPECT_TRUE(torch::equal(gathered, full));
  const torch::Tensor weights = torch::arange(full.numel(), torch::kFloat32).view(full.sizes());
  (gathered * weights).sum().backward();
  EXPECT_TRUE(torch::equal(piece.grad(), weights.narrow(-1, 4 * r, 4)));

  torch::Tensor whole = full.clone().requires_grad_();
  torch::Tensor mine = tp::split_last_dim(whole, group);
  EXPECT_TRUE(torch::equal(mine, full.narrow(-1, 4 * r, 4)));
  (mine * 2.0).sum().backward();  // every rank's slice: the gathered gradient is 2 everywhere
  EXPECT_TRUE(torch::equal(whole.grad(), torch::full(full.sizes(), 2.0)));
}

TEST(Collectives, SequenceGatherAndReduceScatterAreEachOthersTranspose) {
  DeviceMesh mesh = tp_mesh();
  const auto& group = mesh.comm("tp");
  const int r = group->rank(), n = group->size();
  const torch::Tensor full = torch::arange(2 * 2 * n * 3, torch::kFloat32).view({2, 2 * n, 3});
  // gather_sequence: slices [2, 2, 3] -> [2, 2n, 3]; backward sums the ranks' gradients, keeps my slice.
  torch::Tensor slice = full.narrow(1, 2 * r, 2).clone().requires_grad_();
  torch::Tensor whole = tp::gather_sequence(slice, group);
  EXPECT_TRUE(torch::equal(whole, full));
  (whole * static_cast<double>(r + 1)).sum().backward();
  EXPECT_TRUE(torch::equal(slice.grad(), torch::full({2, 2, 3}, n * (n + 1) / 2.0)));
  // reduce_scatter_sequence: every rank's (r+1) * full summed, my slice; backward gathers.
  torch::Tensor partial = (full * static_cast<double>(r + 1)).requires_grad_();
  torch::Tensor mine = tp::reduce_scatter_sequence(partial, group);
  EXPECT_TRUE(torch::equal(mine, full.narrow(1, 2 * r, 2) * (n * (n + 1) / 2.0)));
  (mine * static_cast<double>(r + 1)).sum().backward();
  for (int k = 0; k < n; ++k)
    EXPECT_TRUE(torch::equal(partial.grad().narrow(1, 2 * k, 2), torch::full({2, 2, 3}, k + 1.0))) << "slice " << k;
}

// An MLP block as a GPT has it: fc column-parallel, proj row-parallel,
// against torch::nn::Linear from the same seeds. Also a fused qkv (3 sections).
TEST(ParallelLinear, ColumnThenRowEqualsTheUnsplitLayers) {
  DeviceMesh mesh = tp_mesh();
  const auto& group = mesh.comm("tp");
  const int r = group->rank(), n = group->size();
  const int64_t C = 12, H = 48;
  torch::manual_seed(11);
  torch::nn::Linear fc(C, H);
  torch::nn::Linear proj(H, C);
  torch::manual_seed(11);
  tp::ColumnParallelLinear tp_fc(C, H, group);
  tp::RowParallelLinear tp_proj(H, C, group);
  // Initialisation: this rank's slices of the unsplit layers' numbers, bitwise.
  EXPECT_TRUE(torch::equal(tp_fc->weight, tp::column_slice(fc->weight, r, n)));
  EXPECT_TRUE(torch::equal(tp_fc->bias, fc->bias.narrow(0, r * H / n, H / n)));
  EXPECT_TRUE(torch::equal(tp_proj->weight, tp::row_slice(proj->weight, r, n)));
  EXPECT_TRUE(torch::equal(tp_proj->bias, proj->bias));

  torch::manual_seed(5);
  const torch::Tensor input = torch::randn({2, 5, C});
  torch::Tensor x = input.clone().requires_grad_();
  torch::Tensor expected = proj(torch::gelu(fc(x)));
  expected.pow(2).sum().backward();
  torch::Tensor tp_x = input.clone().requires_grad_();
  torch::Tensor actual = tp_proj(torch::gelu(tp_fc(tp_x)));
  actual.pow(2).sum().backward();
  expect_close(actual, expected, "output");
  expect_close(tp_x.grad(), x.grad(), "input gradient");
  expect_close(tp_fc->weight.grad(), tp::column_slice(fc->weight.grad(), r, n), "fc weight gradient");
  expect_close(tp_fc->bias.grad(), fc->bias.grad().narrow(0, r * H / n, H / n), "fc bias gradient");
  expect_close(tp_proj->weight.grad(), tp::row_slice(proj->weight.grad(), r, n), "proj weight gradient");
  expect_close(tp_proj->bias.grad(), proj->bias.grad(), "proj bias gradient");
}

TEST(ParallelLinear, FusedSectionsAndGatheredOutput) {
  DeviceMesh mesh = tp_mesh();
  const auto& group = mesh.comm("tp");
  const int r = group->rank(), n = group->size();
  const int64_t C = 12;
  torch::manual_seed(3);
  torch::nn::Linear qkv(C, 3 * C);
  torch::manual_seed(3);
  tp::ColumnParallelLinear tp_qkv(C, 3 * C, group, tp::ColumnParallelLinearOptions{.sections = 3});
  // Rank r holds the r-th slice of q, of k and of v (the same heads of each).
  const int64_t piece = C / n;
  for (int s = 0; s < 3; ++s)
    EXPECT_TRUE(torch::equal(tp_qkv->weight.narrow(0, s * piece, piece), qkv->weight.narrow(0, s * C + r * piece, piece)))
        << "section " << s;
  // gather_output: the full output on every rank, in the unsplit layer's column order (1 section).
  torch::manual_seed(4);
  torch::nn::Linear head(C, 24);
  torch::manual_seed(4);
  tp::ColumnParallelLinear tp_head(C, 24, group, tp::ColumnParallelLinearOptions{.gather_output = true});
  const torch::Tensor input = torch::randn({4, C});
  torch::Tensor x = input.clone().requires_grad_();
  head(x).sin().sum().backward();
  torch::Tensor tp_x = input.clone().requires_grad_();
  torch::Tensor out = tp_head(tp_x);
  out.sin().sum().backward();
  expect_close(out, head(input), "gathered output");
  expect_close(tp_x.grad(), x.grad(), "input gradient");
  expect_close(tp_head->weight.grad(), tp::column_slice(head->weight.grad(), r, n), "weight gradient");
}

TEST(VocabParallel, EmbeddingEqualsTheUnsplitEmbedding) {
  DeviceMesh mesh = tp_mesh();
  const auto& group = mesh.comm("tp");
  const int r = group->rank(), n = group->size();
  const int64_t V = 24, D = 8;
  torch::manual_seed(9);
  torch::nn::Embedding embedding(V, D);
  torch::manual_seed(9);
  tp::VocabParallelEmbedding tp_embedding(V, D, group);
  EXPECT_TRUE(torch::equal(tp_embedding->weight, embedding->weight.narrow(0, r * V / n, V / n)));
  const torch::Tensor tokens = torch::tensor({{0, 5, 23, 12}, {7, 7, 18, 1}});
  const torch::Tensor weights = torch::randn({2, 4, D});
  torch::Tensor expected = embedding(tokens);
  (expected * weights).sum().backward();
  torch::Tensor actual = tp_embedding(tokens);
  (actual * weights).sum().backward();
  EXPECT_TRUE(torch::equal(actual, expected));  // one non-zero term per sum: exact
  EXPECT_TRUE(torch::equal(tp_embedding->weight.grad(), embedding->weight.grad().narrow(0, r * V / n, V / n)));
}

TEST(VocabParallel, CrossEntropyEqualsTheFullLogitsOne) {
  DeviceMesh mesh = tp_mesh();
  const auto& group = mesh.comm("tp");
  const int r = group->rank(), n = group->size();
  const int64_t N = 6, V = 24;
  torch::manual_seed(21);
  const torch::Tensor logits = torch::randn({N, V}) * 4.0;
  const torch::Tensor targets = torch::tensor({0, 23, 5, 12, 11, 17});
  const torch::Tensor row_weights = torch::arange(1, N + 1, torch::kFloat32);
  torch::Tensor full = logits.clone().requires_grad_();
  torch::Tensor expected = torch::nn::functional::cross_entropy(
      full, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  (expected * row_weights).sum().backward();
  torch::Tensor slice = logits.narrow(1, r * V / n, V / n).clone().requires_grad_();
  torch::Tensor actual = tp::vocab_parallel_cross_entropy(slice, targets, group);
  (actual * row_weights).sum().backward();
  expect_close(actual, expected, "loss");
  expect_close(slice.grad(), full.grad().narrow(1, r * V / n, V / n), "logits gradient");
}

TEST(TensorParallel, SizesThatDoNotSplitAreRejectedWithTheNumbers) {
  DeviceMesh mesh = tp_mesh();
  const auto& group = mesh.comm("tp");
  const int n = group->size();
  if (n == 1) return;  // everything splits across one rank
  try {
    tp::VocabParallelEmbedding embedding(n * 5 + 1, 4, group);
    ADD_FAILURE() << "a vocabulary of " << n * 5 + 1 << " split across " << n;
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("vocabulary (" + std::to_string(n * 5 + 1) + " tokens)"),
              std::string::npos)
        << error.what();
  }
  EXPECT_THROW(tp::ColumnParallelLinear(4, n * 3 + 1, group), std::invalid_argument);
  EXPECT_THROW(tp::RowParallelLinear(n * 3 + 1, 4, group), std::invalid_argument);
}

// tp::clip_grad_norm: a weight split by rows across the group and a
// replicated bias give the norm of the whole gradients (the slices' parts
// summed, the replicated one counted once) and are scaled as
// torch::nn::utils::clip_grad_norm_ scales the whole ones on one process.
TEST(TensorParallel, ClipGradNormEqualsTheUnsplitClipping) {
  DeviceMesh mesh = tp_mesh();
  auto& group = *mesh.comm("tp");
  const int n = group.size(), r = group.rank();
  torch::manual_seed(7);  // the same whole gradients on every rank
  const auto weight_grad = torch::randn({4 * n, 3}), bias_grad = torch::randn({5});
  auto weight = torch::zeros({4, 3}).requires_grad_(true), bias = torch::zeros({5}).requires_grad_(true);
  auto whole_weight = torch::zeros({4 * n, 3}).requires_grad_(true), whole_bias = torch::zeros({5}).requires_grad_(true);
  weight.mutable_grad() = weight_grad.narrow(0, 4 * r, 4).clone();
  bias.mutable_grad() = bias_grad.clone();
  whole_weight.mutable_grad() = weight_grad.clone();
  whole_bias.mutable_grad() = bias_grad.clone();
  const double expected = torch::nn::utils::clip_grad_norm_(std::vector<torch::Tensor>{whole_weight, whole_bias}, 1.0);
  const double norm = tp::clip_grad_norm({weight, bias}, {true, false}, 1.0, nullptr, group);
  EXPECT_NEAR(norm, expected, 1e-5 * expected);
  EXPECT_GT(norm, 1.0) << "the gradients must be large enough to be clipped";
  expect_close(weight.grad(), whole_weight.grad().narrow(0, 4 * r, 4), "the weight slice's clipped gradient");
  expect_close(bias.grad(), whole_bias.grad(), "the replicated bias's clipped gradient");
  EXPECT_THROW(tp::clip_grad_norm({weight, bias}, {true}, 1.0, nullptr, group), std::invalid_argument);
}

// (dp, tp) = (2, 2) at 4 ranks: each tp group works on its own, the dp groups
// see the same layer slices on their tp coordinate.
TEST(DeviceMesh, TwoTensorParallelGroupsSideBySide) {
  if (world().size() != 4) return;
  DeviceMesh mesh(world_ptr(), {{"dp", 2}, {"tp", 2}});
  const auto& group = mesh.comm("tp");
  torch::manual_seed(11);
  torch::nn::Linear fc(12, 24);
  torch::manual_seed(11);
  tp::ColumnParallelLinear tp_fc(12, 24, group, tp::ColumnParallelLinearOptions{.gather_output = true});
  torch::manual_seed(100 + mesh.rank("dp"));  // each dp row its own data
  const torch::Tensor input = torch::randn({3, 12});
  expect_close(tp_fc(input), fc(input), "output of dp row " + std::to_string(mesh.rank("dp")));
  torch::Tensor slice = tp_fc->weight.detach().clone();
  mesh.comm("dp")->blocking().all_reduce(slice, dtrain::ReduceOp::Max);
  EXPECT_TRUE(torch::equal(slice, tp_fc->weight)) << "the dp groups hold the same slices";
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
