// One (query chunk, key chunk) pair of ring attention (src/cp/ring_attention.cpp):
// its attention normalised over its keys, and its share of the gradients
// given the merged result, on the kernel the device has.
#pragma once

#include <torch/types.h>

namespace dtrain::cp {

// Of queries in chunk a against keys in chunk b: none when b is later,
// the lower triangle when b == a, all when b is earlier.
enum class Pairs { None, Diagonal, All };

// What computes a pair:
// - CpuFlash: LibTorch's CPU flash kernel, which returns the log-sum-exp
//   and holds no [c, c] scores;
// - CudaEfficient: the memory-efficient CUDA kernel (fp32, or fp16 and
//   bf16 at a head_dim multiple of 8), which returns the log-sum-exp
//   padded to a multiple of 32 queries and holds no [c, c] scores either;
// - MatrixProducts: matrix products over the pair's scores in fp32, on any
//   device (Ring::fused false).
enum class PairKernel { MatrixProducts, CpuFlash, CudaEfficient };
PairKernel pair_kernel(bool fused, const torch::Tensor& q);

// The pair's output and the log-sum-exp of its scaled scores per query, fp32.
struct Partial {
  torch::Tensor out, lse;
};
Partial pair_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, Pairs pairs, double scale,
                     PairKernel kernel);

// The pair's share of the gradients (fp32), given the whole attention's
// output and log-sum-exp (the merged ones): softmax's backward needs the
// final probabilities, exp(scores - lse), and rowsum(dO * O) of the final
// output.
struct PairGradients {
  torch::Tensor dq, dk, dv;
};
PairGradients pair_backward(const torch::Tensor& dout, const torch::Tensor& q, const torch::Tensor& k,
                            const torch::Tensor& v, const torch::Tensor& out, const torch::Tensor& lse, Pairs pairs,
                            double scale, PairKernel kernel);

}  // namespace dtrain::cp
