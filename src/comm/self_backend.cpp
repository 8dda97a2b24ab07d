// The one-rank world a program gets when no launcher started it, so the same
// program runs single-process without mpirun or torchrun.
#include "comm/backend.h"

namespace dtrain {
namespace {

class SelfBackend final : public Backend {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "self"; }
  void all_reduce(torch::Tensor&, BackendReduce) override {}
  void all_gather(const torch::Tensor& shard, torch::Tensor& full) override { full.copy_(shard); }
  void reduce_scatter(const torch::Tensor& full, torch::Tensor& shard, BackendReduce) override { shard.copy_(full); }
  void all_to_all(const torch::Tensor& input, torch::Tensor& output) override { output.copy_(input); }
  void broadcast(torch::Tensor&, int) override {}
  void barrier() override {}
  void send(const torch::Tensor&, int, int) override { throw CommError("send: a one-rank world has no peers"); }
  void recv(torch::Tensor&, int, int) override { throw CommError("recv: a one-rank world has no peers"); }
  std::unique_ptr<Backend> split(int color, int) override {
    return color < 0 ? nullptr : std::make_unique<SelfBackend>();
  }
  [[noreturn]] void abort_job(int exit_code) override { std::_Exit(exit_code); }
};

}  // namespace

std::unique_ptr<Backend> make_self_backend() { return std::make_unique<SelfBackend>(); }

}  // namespace dtrain
