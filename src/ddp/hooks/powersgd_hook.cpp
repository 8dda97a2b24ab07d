// PowerSGD (Vogels, Karimireddy and Jaggi, 2019): each gradient matrix M
// (n x m, the tensor viewed as its first dimension by the rest) is sent as
// two thin factors, P = M Q (n x r) and Q = M^T P (m x r), with one step of
// power iteration per training step:
//   P = sum_ranks(M Q); orthonormalise P; Q = sum_ranks(M^T P) / W;
//   M ~= P Q^T  (= P P^T mean(M): exact whenever mean(M) has rank <= r).
// Tensors that would not shrink by min_compression_rate go uncompressed, all
// in one all-reduce per bucket.
#include <dtrain/comm_hooks.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain::hooks {
namespace {

struct BucketState {
  std::vector<std::string> names;  // the members the state belongs to
  torch::Tensor error;       // error feedback memory, like the bucket
  torch::Tensor q_flat;      // every compressed tensor's Q, packed
  at::Generator generator;   // same seed, same draws on every rank
};

struct Layout {
  std::vector<int> compressed;    // indices into bucket.gradients
  std::vector<int> uncompressed;
  std::vector<int64_t> rows, cols, ranks;
  int64_t p_elements = 0, q_elements = 0;
};

Layout plan(const GradBucket& bucket, const PowerSGDOptions& options) {
  Layout layout;
  for (size_t i = 0; i < bucket.gradients.size(); ++i) {
    const auto& g = bucket.gradients[i];
    if (g.dim() >= 2) {
      const int64_t n = g.size(0), m = g.numel() / std::max<int64_t>(n, 1);
      const int64_t r = std::min<int64_t>({options.rank, n, m});
      if (n > 0 && static_cast<double>((n + m) * r) * options.min_compression_rate <= static_cast<double>(n * m)) {
        layout.compressed.push_back(static_cast<int>(i));
        layout.rows.push_back(n);
        layout.cols.push_back(m);
        layout.ranks.push_back(r);
        layout.p_elements += n * r;
        layout.q_elements += m * r;
        continue;
      }
    }
    layout.uncompressed.push_back(static_cast<int>(i));
  }
  return layout;
}

// Modified Gram-Schmidt on the columns; eps keeps an all-zero column finite.
void orthonormalize_columns(torch::Tensor p) {
  const int64_t r = p.size(1);
  for (int64_t i = 0; i < r; ++i) {
    auto column = p.select(1, i);
    column.div_(column.norm() + 1e-8);
    if (i + 1 < r) {
      auto rest = p.narrow(1, i + 1, r - i - 1);
      rest.sub_(column.unsqueeze(1) * column.matmul(rest).unsqueeze(0));
    }
  }
}

// Views of a packed buffer, one matrix per compressed tensor.
std::vector<torch::Tensor> unpack(const torch::Tensor& flat, const std::vector<int64_t>& first,
                                  const std::vector<int64_t>& ranks) {
  std::vector<torch::Tensor> views;
  int64_t offset = 0;
  for (size_t i = 0; i < first.size(); ++i) {
    views.push_back(flat.narrow(0, offset, first[i] * ranks[i]).view({first[i], ranks[i]}));
    offset += first[i] * ranks[i];
  }
  return views;
}

class PowerSGDReduction : public PendingReduction {
 public:
  PowerSGDReduction(GradBucket& bucket, Communicator& comm, BucketState& state, Layout layout, bool error_feedback,
                    torch::Tensor input, torch::Tensor uncompressed, WorkPtr uncompressed_work, torch::Tensor p_flat,
                    WorkPtr p_work)
      : bucket_(bucket), comm_(comm), state_(state), layout_(std::move(layout)), error_feedback_(error_feedback),
        input_(std::move(input)), uncompressed_(std::move(uncompressed)),
        uncompressed_work_(std::move(uncompressed_work)), p_flat_(std::move(p_flat)), p_work_(std::move(p_work)) {}

  void wait() override {
    torch::NoGradGuard no_grad;
    if (uncompressed_work_) {
      uncompressed_work_->wait();
      int64_t offset = 0;
      for (int i : layout_.uncompressed) {
        auto& g = bucket_.gradients[i];
        g.copy_(uncompressed_.narrow(0, offset, g.numel()).view(g.sizes()));
        offset += g.numel();
      }
    }
    if (layout_.compressed.empty()) return;

    p_work_->wait();
    auto ps = unpack(p_flat_, layout_.rows, layout_.ranks);
    auto qs = unpack(state_.q_flat, layout_.cols, layout_.ranks);
    for (size_t k = 0; k < ps.size(); ++k) {
      orthonormalize_columns(ps[k]);
      const auto m = matrix(input_, layout_.compressed[k]);
      at::matmul_out(qs[k], m.t(), ps[k]);
    }
    comm_.blocking().all_reduce(state_.q_flat, ReduceOp::Sum);
    state_.q_flat.div_(comm_.size());
    for (size_t k = 0; k < ps.size(); ++k) {
      auto approximation = bucket_.gradients[layout_.compressed[k]].view({layout_.rows[k], layout_.cols[k]});
      at::matmul_out(approximation, ps[k], qs[k].t());
      if (error_feedback_) {
        auto error = matrix(state_.error, layout_.compressed[k]);
        at::sub_out(error, matrix(input_, layout_.compressed[k]), approximation);
      }
    }
  }

 private:
  // The bucket-shaped buffer `flat` seen as compressed tensor i's matrix.
  torch::Tensor matrix(const torch::Tensor& flat, int i) const {
    int64_t offset = 0;
    for (int j = 0; j < i; ++j) offset += bucket_.gradients[j].numel();
    const auto& g = bucket_.gradients[i];
    return flat.narrow(0, offset, g.numel()).view({g.size(0), g.numel() / g.size(0)});
  }

  GradBucket& bucket_;
  Communicator& comm_;
  BucketState& state_;
  Layout layout_;
  bool error_feedback_;
  torch::Tensor input_, uncompressed_;
  WorkPtr uncompressed_work_;
  torch::Tensor p_flat_;
  WorkPtr p_work_;
};

class PowerSGDHook : public CommHook {
 public:
  explicit PowerSGDHook(PowerSGDOptions options) : options_(options) {
    if (options_.rank < 1) throw std::invalid_argument("PowerSGD: rank must be at least 1");
    if (options_.min_compression_rate <= 0) throw std::invalid_argument("PowerSGD: min_compression_rate must be > 0");
  }
  std::string name() const override { return "powersgd"; }

  std::unique_ptr<PendingReduction> reduce(GradBucket& bucket, HookContext& ctx) override {
    torch::NoGradGuard no_grad;
    const int64_t element = static_cast<int64_t>(bucket.buffer.element_size());
    if (ctx.iteration < options_.start_iteration) return average(bucket, ctx);
    Layout layout = plan(bucket, options_);
    BucketState& state = state_for(bucket, layout);

    if (options_.error_feedback) bucket.buffer.add_(state.error);
    // The compressed tensors are overwritten by their approximation later.
    auto input = bucket.buffer.clone();

    torch::Tensor uncompressed;
    WorkPtr uncompressed_work;
    if (!layout.uncompressed.empty()) {
      std::vector<torch::Tensor> pieces;
      for (int i : layout.uncompressed) pieces.push_back(bucket.gradients[i].reshape({-1}));
      uncompressed = torch::cat(pieces);
      ctx.bytes_sent += uncompressed.numel() * element;
      uncompressed_work = ctx.comm.all_reduce(uncompressed, ReduceOp::Avg);
    }

    torch::Tensor p_flat;
    WorkPtr p_work;
    if (!layout.compressed.empty()) {
      if (!options_.warm_start) state.q_flat.copy_(torch::randn(state.q_flat.sizes(), state.generator));
      p_flat = torch::empty({layout.p_elements}, bucket.buffer.options());
      auto ps = unpack(p_flat, layout.rows, layout.ranks);
      auto qs = unpack(state.q_flat, layout.cols, layout.ranks);
      for (size_t k = 0; k < ps.size(); ++k) {
        const auto& g = bucket.gradients[layout.compressed[k]];
        at::matmul_out(ps[k], g.view({layout.rows[k], layout.cols[k]}), qs[k]);
      }
      ctx.bytes_sent += (layout.p_elements + layout.q_elements) * element;
      p_work = ctx.comm.all_reduce(p_flat, ReduceOp::Sum);
    }
    return std::make_unique<PowerSGDReduction>(bucket, ctx.comm, state, std::move(layout), options_.error_feedback,
                                               std::move(input), std::move(uncompressed),
                                               std::move(uncompressed_work), std::move(p_flat), std::move(p_work));
  }

 private:
  BucketState& state_for(const GradBucket& bucket, const Layout& layout) {
    auto [it, fresh] = states_.try_emplace(bucket.index);
    BucketState& state = it->second;
    // DDP rebuilds its buckets once, after the first step
    // (DDPOptions::rebuild_buckets): a bucket with other members starts afresh.
    if (fresh || state.names != bucket.names) {
      state.names = bucket.names;
      state.error = torch::zeros_like(bucket.buffer);
      state.generator = at::make_generator<at::CPUGeneratorImpl>(options_.seed + 1000003ULL * bucket.index);
      auto q = torch::randn({layout.q_elements}, state.generator, torch::dtype(bucket.buffer.scalar_type()));
      state.q_flat = q.to(bucket.buffer.device());
    }
    return state;
  }

  PowerSGDOptions options_;
  std::map<int, BucketState> states_;
};

}  // namespace

CommHookPtr powersgd(PowerSGDOptions options) { return std::make_shared<PowerSGDHook>(options); }

}  // namespace dtrain::hooks
