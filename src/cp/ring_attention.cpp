// Ring attention (dtrain/context_parallel.h): causal attention over a
// sequence whose chunks are spread over a cp group, computed block by block
// as the keys and values travel around the ring, merged with an online
// softmax; backward sends the blocks around again with their gradients.
#include "dtrain/context_parallel.h"

#include "dtrain/trace.h"
#include "cp/pair_attention.h"

#include <torch/autograd.h>
#include <torch/custom_class.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

namespace dtrain::cp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Sends `out` to the next rank of the ring and receives `in` from the one
// before. A send may wait for its receiver on the channel's thread, so even
// ranks send first and odd ranks receive first (dtrain/comm.h): the ring
// never waits on itself, for any size. Returns both operations.
std::vector<WorkPtr> pass_on(const CommPtr& channel, const torch::Tensor& out, const torch::Tensor& in) {
  const int n = channel->size(), r = channel->rank();
  const int next = (r + 1) % n, previous = (r + n - 1) % n;
  if (r % 2 == 0) {
    WorkPtr sent = channel->send(out, next);
    return {sent, channel->recv(in, previous)};
  }
  WorkPtr received = channel->recv(in, previous);
  return {channel->send(out, next), received};
}

void wait_all(std::vector<WorkPtr>& works) {
  if (works.empty()) return;
  trace::Span waiting("cp_ring_wait", trace::category::wait);
  for (auto& work : works) work->wait();
  works.clear();
}

// The global chunk index of local chunk `which` (0: head, 1: tail) of rank `r` of `n`.
int64_t chunk_index(int r, int n, int which) { return which == 0 ? r : 2 * n - 1 - r; }

// Which pairs of chunk a's queries attend to chunk b's keys.
Pairs pairs_of(int64_t a, int64_t b) { return b > a ? Pairs::None : b == a ? Pairs::Diagonal : Pairs::All; }

// Before ring step i: the block the next step computes with, on its way from
// the rank before while `block` goes on to the next (none after the last
// step). Without the overlap, it has arrived when this returns.
torch::Tensor start_next_block(const Ring& ring, int i, const torch::Tensor& block, std::vector<WorkPtr>& transfers) {
  if (i + 1 >= ring.group->size()) return {};
  torch::Tensor next = torch::empty_like(block);
  transfers = pass_on(ring.blocks, block, next);
  if (!ring.overlap) wait_all(transfers);
  return next;
}

// A chunk's local rows [which * c, (which + 1) * c) along the sequence dimension (2).
torch::Tensor rows(const torch::Tensor& x, int which, int64_t c) { return x.narrow(2, which * c, c); }

// Calls `body(query chunk, key chunk, pairs)` for the pairs rank r computes
// against the block that rank `source` holds.
template <typename Body>
void for_each_pair(int r, int source, int n, Body&& body) {
  for (int qa = 0; qa < 2; ++qa) {
    for (int kb = 0; kb < 2; ++kb) {
      const Pairs pairs = pairs_of(chunk_index(r, n, qa), chunk_index(source, n, kb));
      if (pairs != Pairs::None) body(qa, kb, pairs);
    }
  }
}

// What forward and backward both derive from the ring and the queries: the
// ring's size and this rank's place, the chunk length, softmax's scale, and
// which kernel the pairs run.
struct Geometry {
  Geometry(const Ring& ring, const torch::Tensor& q)
      : n(ring.group->size()),
        r(ring.group->rank()),
        c(q.size(2) / 2),
        scale(1.0 / std::sqrt(static_cast<double>(q.size(-1)))),
        kernel(pair_kernel(ring.fused, q)) {}
  int n, r;
  int64_t c;
  double scale;
  PairKernel kernel;
};

// Keeps the ring's communicators alive with the graph until backward has run.
struct RingHolder : torch::CustomClassHolder {
  explicit RingHolder(Ring r) : ring(std::move(r)) {}
  Ring ring;
};

struct RingAttention : torch::autograd::Function<RingAttention> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const Ring& ring) {
    const Geometry g(ring, q);
    const int n = g.n, r = g.r;
    const int64_t c = g.c;
    const auto fp32 = q.options().dtype(torch::kFloat);
    // The running result, normalised over the keys seen so far, and their log-sum-exp.
    // Laid out as [B, tokens, heads, head_dim] (a transposed view of it), as
    // the flash kernel lays its output out: the caller's transpose and
    // reshape to [B, tokens, heads x head_dim] is then a view, not a copy
    // that the output projection would keep besides this saved one.
    torch::Tensor out = torch::zeros({q.size(0), q.size(2), q.size(1), q.size(3)}, fp32).transpose(1, 2);
    torch::Tensor lse = torch::full({q.size(0), q.size(1), q.size(2)}, -std::numeric_limits<double>::infinity(), fp32);
    torch::Tensor block = torch::stack({k, v}).contiguous();  // travels in the inputs' dtype
    std::vector<WorkPtr> transfers;
    for (int i = 0; i < n; ++i) {
      const int source = (r - i + n) % n;
      const torch::Tensor next = start_next_block(ring, i, block, transfers);
      {
        trace::Span computing("cp_attention", trace::category::compute, {{"step", i}});
        for_each_pair(r, source, n, [&](int qa, int kb, Pairs pairs) {
          const Partial part = pair_forward(rows(q, qa, c), rows(block[0], kb, c), rows(block[1], kb, c), pairs,
                                             g.scale, g.kernel);
          // Online softmax: rescale what is there and what comes to the new total.
          torch::Tensor out_rows = rows(out, qa, c), lse_rows = lse.narrow(2, qa * c, c);
          const torch::Tensor total = torch::logaddexp(lse_rows, part.lse);
          out_rows.mul_(torch::exp(lse_rows - total).unsqueeze(-1))
              .add_(part.out * torch::exp(part.lse - total).unsqueeze(-1));
          lse_rows.copy_(total);
        });
      }
      if (i + 1 < n) {
        wait_all(transfers);
        block = next;
      }
    }
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<RingHolder>(ring));
    // In fp32 this is the saved `out` itself: an in-place change of the
    // attention's output would fail backward's version check, not corrupt it.
    return out.to(q.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Ring ring = c10::static_intrusive_pointer_cast<RingHolder>(ctx->saved_data["group"].toCapsule())->ring;
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const Geometry g(ring, q);
    const int n = g.n, r = g.r;
    const int64_t c = g.c;
    const auto fp32 = q.options().dtype(torch::kFloat);
    const torch::Tensor dout = grads[0].to(torch::kFloat);
    torch::Tensor dq = torch::zeros(q.sizes(), fp32);
    torch::Tensor block = torch::stack({k, v}).contiguous();
    torch::Tensor received;  // the gradient sum of the block in hand, from the ranks before
    std::vector<WorkPtr> transfers, gradient_transfers;
    for (int i = 0; i < n; ++i) {
      const int source = (r - i + n) % n;
      const torch::Tensor next = start_next_block(ring, i, block, transfers);
      // This rank's part of the block's gradient (keys, values), fp32.
      torch::Tensor gradient = torch::zeros({2, k.size(0), k.size(1), k.size(2), k.size(3)}, fp32);
      {
        trace::Span computing("cp_attention_backward", trace::category::compute, {{"step", i}});
        for_each_pair(r, source, n, [&](int qa, int kb, Pairs pairs) {
          const PairGradients pair =
              pair_backward(rows(dout, qa, c), rows(q, qa, c), rows(block[0], kb, c), rows(block[1], kb, c),
                             rows(out, qa, c), lse.narrow(2, qa * c, c), pairs, g.scale, g.kernel);
          rows(dq, qa, c).add_(pair.dq);
          rows(gradient[0], kb, c).add_(pair.dk);
          rows(gradient[1], kb, c).add_(pair.dv);
        });
      }
      if (n > 1) {
        // Add what the ranks before gave the block, and pass the sum on: after
        // the last step every block's sum arrives at its owner.
        if (i > 0) {
          wait_all(gradient_transfers);
          gradient.add_(received);
        }
        received = torch::empty_like(gradient);
        gradient_transfers = pass_on(ring.gradients, gradient, received);
      } else {
        received = gradient;
      }
      if (i + 1 < n) {
        wait_all(transfers);
        block = next;
      }
    }
    wait_all(gradient_transfers);
    return {dq.to(q.scalar_type()), received[0].to(k.scalar_type()), received[1].to(v.scalar_type()),
            torch::Tensor()};
  }
};

}  // namespace

Ring make_ring(CommPtr group, bool overlap, bool fused) {
  if (!group) throw std::invalid_argument("context parallel: no group");
  const int rank = group->rank();
  Ring ring;
  ring.blocks = group->split(0, rank);
  ring.gradients = group->split(0, rank);
  ring.group = std::move(group);
  ring.overlap = overlap;
  ring.fused = fused;
  return ring;
}

torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const Ring& ring) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.sizes() == q.sizes(),
              "ring_attention: q, k, v must be [B, heads, tokens, head_dim] of one shape, got ", q.sizes(), ", ",
              k.sizes(), ", ", v.sizes());
  TORCH_CHECK(q.size(2) % 2 == 0, "ring_attention: a rank holds two equal chunks, got ", q.size(2), " tokens");
  return RingAttention::apply(q, k, v, ring);
}

}  // namespace dtrain::cp
