// The server side of the parameter server (include/dtrain/ps.h): one
// server's piece of the parameters, its optimizer, and the rules of the
// three modes.
#include "dtrain/ps.h"
#include "ps/flat_parameters.h"
#include "ps/wire.h"
#include "dtrain/grad_norm.h"
#include "dtrain/trace.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace dtrain::ps {

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
//
// Note [parameter-server checkpoints]
// A checkpoint must catch the servers between updates that every worker
// agrees on. Each worker, after the reply to its last push of step t,
// announces the checkpoint (a Checkpoint message, no reply) and enters the
// save; a server keeps serving the others until every running worker has
// announced it, then saves with them. Sync: workers announce at the version
// they hold, and a late worker (backup workers) is answered with the version
// the others wait at, so all announce the same step and nothing is half
// gathered (with one server: two servers may answer a late worker with
// different versions, so checkpoints with backup workers need one server,
// and the server checks that the announced step is its own). Async/SSP:
// each worker announces after its t-th push; the snapshot holds exactly t
// pushes of every worker. A fast worker waits for the slowest inside the
// save's first collective, which the communicator's timeout (DTRAIN_TIMEOUT)
// bounds: an async run whose workers drift further apart than that between
// checkpoints fails with the timeout's error. A server's piece is saved
// as one slice per parameter it overlaps (ServerSlice), so the checkpoint is
// the ordinary sharded one and loads into any strategy at any world size.

class Server::Impl {
 public:
  Impl(const Group& group, const std::vector<torch::Tensor>& parameters, const OptimizerFactory& make_optimizer)
      : group_(group), options_(group.options()), workers_(group.workers()),
        clocks_(static_cast<size_t>(workers_), 0), done_(static_cast<size_t>(workers_), false),
        held_(static_cast<size_t>(workers_), false), paused_(static_cast<size_t>(workers_), false),
        inbox_(static_cast<size_t>(workers_)), receives_(static_cast<size_t>(workers_)),
        step_gradients_(static_cast<size_t>(workers_)), step_flags_(static_cast<size_t>(workers_), 0) {
    const torch::Tensor initial = agree_on_initial_parameters(group_, parameters);
    piece_ = shard_range(initial.numel(), group_.servers(), group_.server_index());
    piece_tensor_ = initial.narrow(0, piece_.offset, piece_.count).clone();
    make_slices(parameters);
    optimizer_ = make_optimizer(slice_values());
    if (!optimizer_) throw std::invalid_argument("parameter server: the optimizer factory returned null");
  }

  const std::vector<ServerSlice>& slices() const { return slices_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  void resume_at(int64_t step) {
    if (version_ != 0 || report_.pushes != 0)
      throw std::logic_error(describe_server() + ": resume_at after serving began");
    version_ = step;
    std::fill(clocks_.begin(), clocks_.end(), step);
  }

  ServerReport run(const std::function<void(int64_t)>& at_checkpoint) {
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
      if (all_running_paused()) {
        checkpoint(at_checkpoint);
        last_message = std::chrono::steady_clock::now();  // the save's time is no silence
      }
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
    if (header.kind == MessageKind::Checkpoint) {
      if (std::count(paused_.begin(), paused_.end(), true) > 0 && header.version != pause_step_)
        throw CommError(describe_server() + ": worker " + peer(worker) + " announced a checkpoint at step " +
                        std::to_string(header.version) + " but another worker at step " + std::to_string(pause_step_) +
                        "; every worker must checkpoint at the same steps");
      pause_step_ = header.version;
      paused_[static_cast<size_t>(worker)] = true;
      post_receive(worker);  // its next push, after the checkpoint
      return;
    }
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
        apply_push(payload(message), header, record);
        reply_and_listen(worker);
        break;
      case Mode::SSP:
        apply_push(payload(message), header, record);
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
        step_flags_[static_cast<size_t>(worker)] = header.flags;
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
    int32_t flags = 0;
    for (size_t w = 0; w < step_gradients_.size(); ++w) {
      if (step_gradients_[w].defined()) {
        sum += step_gradients_[w];
        flags |= step_flags_[w];
      }
      step_gradients_[w] = torch::Tensor();
    }
    sum /= static_cast<double>(step_contributors_.size());
    report_.steps.push_back({.version = version_, .contributors = step_contributors_});
    for (const auto& record : step_records_) report_.records.push_back(record);
    set_gradients(sum);
    step_grad_norm_ = 0;
    step_skipped_ = false;
    if (options_.max_grad_norm > 0 || options_.skip_nonfinite) agree_on_step(flags);
    if (step_skipped_) {
      ++report_.skipped;
      ++version_;  // a skipped step still counts, as in DDP
    } else {
      apply(step_lr_);
    }
    for (int worker : step_contributors_) reply_and_listen(worker);
    step_contributors_.clear();
    step_records_.clear();
  }

  // Sync: the averaged step's global norm (every server holds a piece of
  // it: one all-reduce over the servers), clipped to max_grad_norm, and
  // whether to skip it. Every server applies the same versions in order, so
  // these all-reduces pair up.
  void agree_on_step(int32_t flags) {
    const double bound = options_.max_grad_norm > 0 ? options_.max_grad_norm : INFINITY;
    step_grad_norm_ = clip_grad_norm(slice_values(), bound, 2.0, group_.servers_comm().get());
    if (!options_.skip_nonfinite) return;
    // A contributor's loss was not finite on some server's list: all skip.
    auto any = torch::tensor({(flags & kNonfiniteLoss) ? 1.0 : 0.0}, torch::kFloat64);
    group_.servers_comm()->blocking().all_reduce(any, ReduceOp::Max);
    step_skipped_ = any.item<double>() != 0 || !std::isfinite(step_grad_norm_);
  }

  // Async/SSP: one push, applied at once unless its worker skipped it.
  void apply_push(const torch::Tensor& gradient, const MessageHeader& header, const StalenessRecord& record) {
    if (header.flags & kSkipped) {
      ++report_.skipped;
      return;
    }
    set_gradients(gradient.clone());  // the inbox is reused for the worker's next message
    apply(header.lr);
    report_.records.push_back(record);
  }

  // The slices' gradients: views of `gradient` (this server's piece, which
  // the slices tile in order).
  void set_gradients(const torch::Tensor& gradient) {
    int64_t offset = 0;
    for (auto& slice : slices_) {
      slice.values.mutable_grad() = gradient.narrow(0, offset, slice.end - slice.begin);
      offset += slice.end - slice.begin;
    }
  }

  std::vector<torch::Tensor> slice_values() const {
    std::vector<torch::Tensor> values;
    for (const auto& slice : slices_) values.push_back(slice.values);
    return values;
  }

  void apply(double lr) {
    trace::Span span("optimizer_step", trace::category::compute, {{"version", version_}});
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
    optimizer_->step();
    ++version_;
  }

  // The slices of the parameters this server's piece overlaps: views of the
  // piece, so replies send the piece as one tensor.
  void make_slices(const std::vector<torch::Tensor>& parameters) {
    int64_t offset = 0;  // of parameter i in the flat vector
    for (size_t i = 0; i < parameters.size(); ++i) {
      const int64_t numel = parameters[i].numel();
      const int64_t lo = std::max(offset, piece_.offset), hi = std::min(offset + numel, piece_.offset + piece_.count);
      if (lo < hi) {
        torch::Tensor values = piece_tensor_.narrow(0, lo - piece_.offset, hi - lo);
        values.set_requires_grad(true);
        slices_.push_back({.index = i, .begin = lo - offset, .end = hi - offset, .values = values});
      }
      offset += numel;
    }
  }

  bool all_running_paused() const {
    bool any = false;
    for (int worker = 0; worker < workers_; ++worker) {
      const auto w = static_cast<size_t>(worker);
      if (done_[w]) continue;
      if (!paused_[w]) return false;
      any = true;
    }
    return any;
  }

  // Every running worker waits at the same step (each announced it after
  // its reply): nothing is in flight, so the servers' state is that step's.
  void checkpoint(const std::function<void(int64_t)>& at_checkpoint) {
    if (!step_contributors_.empty() || (options_.mode == Mode::Sync && pause_step_ != version_))
      throw CommError(describe_server() + ": the workers announced a checkpoint at step " + std::to_string(pause_step_) +
                      " but this server is at step " + std::to_string(version_) +
                      (step_contributors_.empty() ? "" : " with that step half gathered") +
                      "; every worker must announce the step it holds (with backup workers: use one server)");
    if (at_checkpoint) at_checkpoint(pause_step_);
    std::fill(paused_.begin(), paused_.end(), false);
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
    const bool contributed = std::find(step_contributors_.begin(), step_contributors_.end(), worker) != step_contributors_.end();
    write_header(message, {.kind = kind,
                           .worker = worker,
                           .clock = clocks_[static_cast<size_t>(worker)],
                           .version = version_,
                           .flags = contributed && step_skipped_ ? kSkipped : 0,
                           .grad_norm = contributed ? step_grad_norm_ : 0});
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
  torch::Tensor piece_tensor_;  // this server's piece of the flat parameters
  std::vector<ServerSlice> slices_;  // views of it, one per parameter, in order
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  int64_t version_ = 0;
  std::vector<int64_t> clocks_;  // pushes received from each worker
  std::vector<bool> done_;
  std::vector<bool> held_;  // SSP: reply owed, held back by the bound
  std::vector<bool> paused_;  // announced the checkpoint at pause_step_
  int64_t pause_step_ = 0;
  std::vector<torch::Tensor> inbox_;
  std::vector<WorkPtr> receives_;  // posted receive per worker (null while none)
  std::vector<std::pair<int, WorkPtr>> sends_;
  // Sync: the step being gathered.
  std::vector<torch::Tensor> step_gradients_;
  std::vector<int> step_contributors_;
  std::vector<StalenessRecord> step_records_;
  std::vector<int32_t> step_flags_;
  double step_lr_ = 0;
  // The step last applied (or skipped), for its contributors' replies.
  double step_grad_norm_ = 0;
  bool step_skipped_ = false;
  ServerReport report_;
};

Server::Server(const Group& group, const std::vector<torch::Tensor>& parameters, const OptimizerFactory& make_optimizer) {
  if (!group.is_server())
    throw std::logic_error("parameter server: world rank " + std::to_string(group.world()->rank()) +
                           " is a worker; workers use ps::Worker, the last " + std::to_string(group.servers()) +
                           " ranks run a ps::Server");
  impl_ = std::make_unique<Impl>(group, parameters, make_optimizer);
}

Server::~Server() = default;

const std::vector<ServerSlice>& Server::slices() const { return impl_->slices(); }
torch::optim::Optimizer& Server::optimizer() { return impl_->optimizer(); }
void Server::resume_at(int64_t step) { impl_->resume_at(step); }
ServerReport Server::run(const std::function<void(int64_t)>& at_checkpoint) { return impl_->run(at_checkpoint); }

ServerReport serve(const Group& group, const std::vector<torch::Tensor>& parameters,
                   const OptimizerFactory& make_optimizer) {
  return Server(group, parameters, make_optimizer).run();
}

}  // namespace dtrain::ps
