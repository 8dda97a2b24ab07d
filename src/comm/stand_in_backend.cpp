// dtrain::stand_in_group (include/dtrain/stand_in_group.h): a backend whose
// peers are imagined, so that collectives keep their shapes on one process.
#include "dtrain/stand_in_group.h"

#include "comm/backend.h"
#include "comm/communicator_impl.h"
#include "comm/watchdog.h"

#include <cstdlib>
#include <stdexcept>

namespace dtrain {
namespace {

class StandInBackend final : public Backend {
 public:
  StandInBackend(int size, int rank, std::shared_ptr<StandInTraffic> traffic)
      : size_(size), rank_(rank), traffic_(std::move(traffic)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "stand-in"; }
  void all_reduce(torch::Tensor& tensor, BackendReduce) override { count("all_reduce", tensor); }
  void all_gather(const torch::Tensor& shard, torch::Tensor& full) override {
    count("all_gather", full);
    full.zero_();
    const ShardRange mine = shard_range(full.numel(), size_, rank_);
    full.view(-1).narrow(0, mine.offset, mine.count).copy_(shard.view(-1));
  }
  void reduce_scatter(const torch::Tensor& full, torch::Tensor& shard, BackendReduce) override {
    count("reduce_scatter", full);
    const ShardRange mine = shard_range(full.numel(), size_, rank_);
    shard.view(-1).copy_(full.reshape(-1).narrow(0, mine.offset, mine.count));
  }
  void all_to_all(const torch::Tensor& input, torch::Tensor& output) override {
    count("all_to_all", input);
    output.copy_(input);
  }
  void broadcast(torch::Tensor& tensor, int) override { count("broadcast", tensor); }
  void barrier() override {}
  void send(const torch::Tensor&, int, int) override { throw CommError("send: a stand-in group has no peers"); }
  void recv(torch::Tensor&, int, int) override { throw CommError("recv: a stand-in group has no peers"); }
  std::unique_ptr<Backend> split(int, int) override {
    throw CommError("split: a stand-in group cannot split (its other ranks do not exist)");
  }
  [[noreturn]] void abort_job(int exit_code) override { std::_Exit(exit_code); }

 private:
  void count(const char* operation, const torch::Tensor& payload) {
    if (!traffic_) return;
    auto& entry = traffic_->operations[operation];
    entry.calls += 1;
    entry.payload_bytes += payload.numel() * static_cast<int64_t>(payload.element_size());
  }

  int size_, rank_;
  std::shared_ptr<StandInTraffic> traffic_;
};

}  // namespace

CommPtr stand_in_group(int size, int rank, std::shared_ptr<StandInTraffic> traffic) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument("stand_in_group: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                                " ranks");
  return make_communicator(std::make_unique<StandInBackend>(size, rank, std::move(traffic)),
                           timeout_from_environment(), /*debug=*/false);
}

}  // namespace dtrain
