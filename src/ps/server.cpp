// The server side of the parameter server (include/dtrain/ps.h): one
// server's piece of the parameters, its optimizer, and the rules of the
// three modes.
#include "dtrain/ps.h"
#include "ps/flat_parameters.h"
#include "ps/wire.h"
#include "dtrain/trace.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <string>

namespace dtrain::ps {
namespace {

// Note [backup workers]
// In all-reduce DDP every rank must enter each collective, so a step cannot
// finish before its slowest rank arrives: one straggler sets the pace of all.
// Through a server it can: the server averages the first W - k pushes for
// step t, applies them and answers those workers at once. A push for a step
// already applied is late: it is dropped (counted in ServerReport::dropped)
// and answered at once with the current parameters, so the late worker
// continues at the current step (Worker::next_step jumps ahead) instead of
// falling further behind. The average is over the W - k pushes actually used,
// so the update has the scale of a full step. With S > 1 servers each server
// takes its own first W - k, which may be different workers.

class Server {
 public:
  Server(const Group& group, const std::vector<torch::Tensor>& parameters, const OptimizerFactory& make_optimizer)
      : group_(group), options_(group.options()), workers_(group.workers()),
        clocks_(static_cast<size_t>(workers_), 0), done_(static_cast<size_t>(workers_), false),
        held_(static_cast<size_t>(workers_), false), inbox_(static_cast<size_t>(workers_)),
        receives_(static_cast<size_t>(workers_)), step_gradients_(static_cast<size_t>(workers_)) {
    const torch::Tensor initial = agree_on_initial_parameters(group_, parameters);
    piece_ = shard_range(initial.numel(), group_.servers(), group_.server_index());
    piece_tensor_ = initial.narrow(0, piece_.offset, piece_.count).clone().set_requires_grad(true);
    optimizer_ = make_optimizer({piece_tensor_});
    if (!optimizer_) throw std::invalid_argument("parameter server: the optimizer factory returned null");
  }

  ServerReport run() {
    for (int worker = 0; worker < workers_; ++worker) {
      inbox_[static_cast<size_t>(worker)] = make_message(piece_.count);
      post_receive(worker);
    }
    const auto timeout = wait_limit(*group_.world());
    auto last_message = std::chrono::steady_clock::now();
    Backoff backoff;
    int next = 0;  // round robin, so no worker is always looked at last
    while (std::count(done_.begin(), done_.end(), true) < workers_) {
      int arrived = -1;
      for (int i = 0; i < workers_ && arrived < 0; ++i) {
        const int worker = (next + i) % workers_;
        const auto& work = receives_[static_cast<size_t>(worker)];
        if (work && work->is_completed()) arrived = worker;
      }
      if (arrived < 0) {
        if (std::chrono::steady_clock::now() - last_message > timeout) throw silence_error(timeout);
        backoff.pause();
        continue;
      }
      backoff.reset();
      last_message = std::chrono::steady_clock::now();
      next = (arrived + 1) % workers_;
      auto work = std::move(receives_[static_cast<size_t>(arrived)]);
      work->wait();  // rethrows a failed receive
      handle(arrived);
      collect_finished_sends();
    }
    for (int worker = 0; worker < workers_; ++worker) reply(worker, MessageKind::Final);
    for (auto& [worker, work] : sends_) {
      wait_within(*work, timeout, [&, w = worker] { return describe_server() + ": worker " + peer(w) + " did not take its final parameters"; },
                  ": that worker probably died or is stuck");
    }
    report_.version = version_;
    return report_;
  }

 private:
  void handle(int worker) {
    const torch::Tensor& message = inbox_[static_cast<size_t>(worker)];
    const MessageHeader header = read_header(message);
    if (header.worker != worker)
      throw CommError(describe_server() + ": a message on worker " + std::to_string(worker) +
                      "'s pair says it comes from worker " + std::to_string(header.worker));
    if (header.kind == MessageKind::Done) {
      done_[static_cast<size_t>(worker)] = true;
      if (options_.mode == Mode::Sync) apply_step_if_complete();
      if (options_.mode == Mode::SSP) release_held_replies();
      return;
    }
    if (header.kind != MessageKind::Push)
      throw CommError(describe_server() + ": worker " + peer(worker) + " sent a " + to_string(header.kind) +
                      " message; workers send push or done (Note [parameter-server messages])");
    ++report_.pushes;
    const int64_t lead = header.clock - fewest_pushes();
    clocks_[static_cast<size_t>(worker)] = header.clock + 1;
    const StalenessRecord record{.worker = worker,
                                 .clock = header.clock,
                                 .read_version = header.version,
                                 .applied_version = version_,
                                 .staleness = version_ - header.version,
                                 .clock_lead = lead};
    switch (options_.mode) {
      case Mode::Async:
        apply(payload(message), header.lr);
        report_.records.push_back(record);
        reply_and_listen(worker);
        break;
      case Mode::SSP:
        apply(payload(message), header.lr);
        report_.records.push_back(record);
        held_[static_cast<size_t>(worker)] = true;
        release_held_replies();
        break;
      case Mode::Sync:
        if (header.version > version_)
          throw CommError(describe_server() + ": worker " + peer(worker) + " pushed for step " +
                          std::to_string(header.version) + " but the server is at step " + std::to_string(version_));
        if (header.version < version_) {  // late: see Note [backup workers]
          ++report_.dropped;
          reply_and_listen(worker);
          break;
        }
        step_gradients_[static_cast<size_t>(worker)] = payload(message).clone();
        step_records_.push_back(record);
        step_contributors_.push_back(worker);
        step_lr_ = header.lr;
        apply_step_if_complete();
        break;
    }
  }

  // Sync: applies the step once W - k pushes (or every worker still
  // running, when fewer are left) have arrived.
  void apply_step_if_complete() {
    const auto running = static_cast<size_t>(std::count(done_.begin(), done_.end(), false));
    const size_t needed = std::min(static_cast<size_t>(workers_ - options_.backup_workers), running);
    if (step_contributors_.empty() || step_contributors_.size() < needed) return;
    // Summed in worker order, so the result does not depend on arrival order.
    torch::Tensor sum = torch::zeros({piece_.count}, torch::kFloat);
    for (auto& gradient : step_gradients_) {
      if (gradient.defined()) sum += gradient;
      gradient = torch::Tensor();
    }
    sum /= static_cast<double>(step_contributors_.size());
    report_.steps.push_back({.version = version_, .contributors = step_contributors_});
    for (const auto& record : step_records_) report_.records.push_back(record);
    apply(sum, step_lr_);
    for (int worker : step_contributors_) reply_and_listen(worker);
    step_contributors_.clear();
    step_records_.clear();
  }

  void apply(const torch::Tensor& gradient, double lr) {
    trace::Span span("optimizer_step", trace::category::compute, {{"version", version_}});
    piece_tensor_.mutable_grad() = gradient.clone();
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
    optimizer_->step();
    ++version_;
  }

  // SSP: a worker with c pushes gets its reply once c - (fewest pushes of a
  // running worker) <= s; the fewest only grow, so a released worker never
  // has to be held back again for the same push.
  void release_held_replies() {
    const int64_t fewest = fewest_pushes();
    for (int worker = 0; worker < workers_; ++worker) {
      const auto w = static_cast<size_t>(worker);
      if (held_[w] && clocks_[w] - fewest <= options_.staleness) {
        held_[w] = false;
        reply_and_listen(worker);
      }
    }
  }

  int64_t fewest_pushes() const {
    int64_t fewest = std::numeric_limits<int64_t>::max();
    for (int worker = 0; worker < workers_; ++worker)
      if (!done_[static_cast<size_t>(worker)]) fewest = std::min(fewest, clocks_[static_cast<size_t>(worker)]);
    return fewest == std::numeric_limits<int64_t>::max() ? 0 : fewest;
  }

  // The reply goes first, then the receive for the worker's next message:
  // see Note [one communicator per worker-server pair].
  void reply_and_listen(int worker) {
    reply(worker, MessageKind::Params);
    post_receive(worker);
  }

  void reply(int worker, MessageKind kind) {
    // A fresh buffer per reply: the send reads it later, on the pair's thread.
    torch::Tensor message = make_message(piece_.count);
    write_header(message, {.kind = kind, .worker = worker, .clock = clocks_[static_cast<size_t>(worker)], .version = version_});
    payload(message).copy_(piece_tensor_.detach());
    sends_.emplace_back(worker, group_.pair(worker)->send(message, 0));
  }

  void post_receive(int worker) {
    receives_[static_cast<size_t>(worker)] = group_.pair(worker)->recv(inbox_[static_cast<size_t>(worker)], 0);
  }

  // Surfaces errors of replies already sent and forgets them.
  void collect_finished_sends() {
    auto finished = [](const std::pair<int, WorkPtr>& send) {
      if (!send.second->is_completed()) return false;
      send.second->wait();
      return true;
    };
    sends_.erase(std::remove_if(sends_.begin(), sends_.end(), finished), sends_.end());
  }

  CommError silence_error(std::chrono::milliseconds timeout) const {
    std::string waiting;
    for (int worker = 0; worker < workers_; ++worker)
      if (!done_[static_cast<size_t>(worker)] && !held_[static_cast<size_t>(worker)])
        waiting += (waiting.empty() ? "" : ", ") + peer(worker);
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%g", std::chrono::duration<double>(timeout).count());
    return CommError(describe_server() + ": no message from any worker within " + seconds +
                     " s (DTRAIN_TIMEOUT); still waiting on worker " + waiting +
                     ": that rank probably died, is stuck, or never called push_and_pull / finish");
  }

  std::string describe_server() const {
    return "parameter server " + std::to_string(group_.server_index()) + " (world rank " +
           std::to_string(group_.world()->rank()) + ")";
  }
  std::string peer(int worker) const { return std::to_string(worker) + " (world rank " + std::to_string(worker) + ")"; }

  const Group& group_;
  const Options options_;
  const int workers_;
  ShardRange piece_;
  torch::Tensor piece_tensor_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  int64_t version_ = 0;
  std::vector<int64_t> clocks_;  // pushes received from each worker
  std::vector<bool> done_;
  std::vector<bool> held_;  // SSP: reply owed, held back by the bound
  std::vector<torch::Tensor> inbox_;
  std::vector<WorkPtr> receives_;  // posted receive per worker (null while none)
  std::vector<std::pair<int, WorkPtr>> sends_;
  // Sync: the step being gathered.
  std::vector<torch::Tensor> step_gradients_;
  std::vector<int> step_contributors_;
  std::vector<StalenessRecord> step_records_;
  double step_lr_ = 0;
  ServerReport report_;
};

}  // namespace

ServerReport serve(const Group& group, const std::vector<torch::Tensor>& parameters,
                   const OptimizerFactory& make_optimizer) {
  if (!group.is_server())
    throw std::logic_error("parameter server: world rank " + std::to_string(group.world()->rank()) +
                           " is a worker; workers use ps::Worker, the last " + std::to_string(group.servers()) +
                           " ranks call ps::serve()");
  Server server(group, parameters, make_optimizer);
  return server.run();
}

}  // namespace dtrain::ps
