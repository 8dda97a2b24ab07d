// Roles and communicators of a parameter-server job (include/dtrain/ps.h).
#include "dtrain/ps.h"

#include <stdexcept>
#include <string>

namespace dtrain::ps {

const char* to_string(Mode mode) {
  switch (mode) {
    case Mode::Sync: return "sync";
    case Mode::Async: return "async";
    case Mode::SSP: return "ssp";
  }
  return "unknown";
}

void check_options(const Options& options, int world_size) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("parameter server: " + what); };
  if (options.servers < 1 || options.servers >= world_size)
    fail(std::to_string(options.servers) + " servers on " + std::to_string(world_size) +
         " ranks leaves no worker: use 1 to " + std::to_string(world_size - 1) + " servers (the last ranks serve)");
  const int workers = world_size - options.servers;
  if (options.staleness < 0) fail("the staleness bound must be >= 0, got " + std::to_string(options.staleness));
  if (options.backup_workers < 0 || options.backup_workers >= workers)
    fail(std::to_string(options.backup_workers) + " backup workers out of " + std::to_string(workers) +
         " workers: use 0 to " + std::to_string(workers - 1));
  if (options.max_grad_norm < 0)
    fail("the gradient norm bound must be >= 0 (0: no clipping), got " + std::to_string(options.max_grad_norm));
  if (options.backup_workers > 0 && options.servers > 1 && (options.max_grad_norm > 0 || options.skip_nonfinite))
    fail("backup workers with " + std::to_string(options.servers) + " servers: each server closes a step with its "
         "own first pushes, so the servers cannot agree on a step's norm or a skip; use one server");
  if (options.backup_workers > 0 && options.mode != Mode::Sync)
    fail("backup workers only apply to synchronous training (mode sync), not " + std::string(to_string(options.mode)));
}

Group::Group(CommPtr world, const Options& options) : world_(std::move(world)), options_(options) {
  if (!world_) throw std::invalid_argument("parameter server: the world communicator is null");
  check_options(options_, world_->size());
  const int rank = world_->rank();
  workers_ = world_->size() - options_.servers;
  if (rank < workers_) worker_index_ = rank;
  else server_index_ = rank - workers_;

  workers_comm_ = world_->split(is_worker() ? 0 : -1, rank);
  servers_comm_ = world_->split(is_server() ? 0 : -1, rank);
  // See Note [one communicator per worker-server pair]. Every rank takes
  // part in every split, in the same order; only the pair's two ranks get a
  // communicator back.
  pairs_.resize(static_cast<size_t>(is_worker() ? options_.servers : workers_));
  for (int server = 0; server < options_.servers; ++server) {
    for (int worker = 0; worker < workers_; ++worker) {
      const bool mine = rank == worker || rank == server_rank(server);
      auto pair = world_->split(mine ? 0 : -1, rank == worker ? 0 : 1);
      if (rank == worker) pairs_[static_cast<size_t>(server)] = std::move(pair);
      else if (mine) pairs_[static_cast<size_t>(worker)] = std::move(pair);
    }
  }
}

const CommPtr& Group::pair(int peer_index) const {
  if (peer_index < 0 || peer_index >= static_cast<int>(pairs_.size()))
    throw std::out_of_range("parameter server: no pair communicator with peer " + std::to_string(peer_index) +
                            " (this rank has " + std::to_string(pairs_.size()) + ")");
  return pairs_[static_cast<size_t>(peer_index)];
}

}  // namespace dtrain::ps
