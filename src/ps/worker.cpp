// The worker side of the parameter server (include/dtrain/ps.h).
#include "dtrain/grad_norm.h"
#include "dtrain/ps.h"
#include "ps/flat_parameters.h"
#include "ps/wire.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <iostream>
#include <stdexcept>
#include <string>

namespace dtrain::ps {

Worker::Worker(const Group& group, std::vector<torch::Tensor> parameters)
    : group_(group),
      parameters_(std::move(parameters)),
      versions_(static_cast<size_t>(group.servers()), 0) {
  if (!group_.is_worker())
    throw std::logic_error("parameter server: rank " + std::to_string(group_.world()->rank()) +
                           " is a server; servers call ps::serve(), not ps::Worker");
  const torch::Tensor initial = agree_on_initial_parameters(group_, parameters_);
  total_ = initial.numel();
  copy_into_parameters(initial, parameters_);
}

Worker::~Worker() {
  // A worker that leaves without finish() would leave the servers waiting
  // for it until the timeout: say so (the servers' error names this rank).
  if (!finished_ && !std::uncaught_exceptions())
    std::cerr << "dtrain: parameter-server worker " << group_.worker_index()
              << " was destroyed without finish(); the servers will time out waiting for it" << std::endl;
}

int64_t Worker::next_step() const {
  if (group_.options().mode != Mode::Sync) return pushes_;
  return *std::min_element(versions_.begin(), versions_.end());
}

void Worker::resume_at(int64_t step) {
  if (pushes_ != 0 || finished_) throw std::logic_error("parameter server: Worker::resume_at after the first push");
  std::fill(versions_.begin(), versions_.end(), step);
  pushes_ = step;
}

Worker::PushResult Worker::push_and_pull(double lr, bool loss_finite) {
  if (finished_) throw std::logic_error("parameter server: push_and_pull after finish()");
  const Options& options = group_.options();
  int32_t flags = loss_finite ? 0 : kNonfiniteLoss;
  PushResult own;
  if (options.mode != Mode::Sync && (options.max_grad_norm > 0 || options.skip_nonfinite)) {
    // A push is a whole update here: this worker clips and judges it itself.
    own.grad_norm = clip_grad_norm(parameters_, options.max_grad_norm > 0 ? options.max_grad_norm : INFINITY, 2.0, nullptr);
    own.skipped = options.skip_nonfinite && (!loss_finite || !std::isfinite(own.grad_norm));
    if (own.skipped) flags |= kSkipped;
  }
  PushResult result = exchange(static_cast<int>(MessageKind::Push), lr, flags);
  ++pushes_;
  return options.mode == Mode::Sync ? result : own;
}

void Worker::announce_checkpoint(int64_t step) {
  if (finished_) throw std::logic_error("parameter server: announce_checkpoint after finish()");
  const auto timeout = wait_limit(*group_.world());
  std::vector<WorkPtr> sends;
  for (int server = 0; server < group_.servers(); ++server) {
    torch::Tensor message = make_message(shard_range(total_, group_.servers(), server).count);
    write_header(message, {.kind = MessageKind::Checkpoint, .worker = group_.worker_index(), .clock = pushes_, .version = step});
    sends.push_back(group_.pair(server)->send(message, 1));
  }
  for (int server = 0; server < group_.servers(); ++server) {
    wait_within(*sends[static_cast<size_t>(server)], timeout, [&] {
      return "parameter-server worker " + std::to_string(group_.worker_index()) + " could not announce the checkpoint of step " +
             std::to_string(step) + " to server " + std::to_string(server) + " (world rank " +
             std::to_string(group_.server_rank(server)) + ")";
    }, ": that server probably died or is stuck");
  }
}

void Worker::finish() {
  if (finished_) throw std::logic_error("parameter server: finish() called twice");
  exchange(static_cast<int>(MessageKind::Done), 0, 0);
  finished_ = true;
}

Worker::PushResult Worker::exchange(int kind_value, double lr, int32_t flags) {
  const auto kind = static_cast<MessageKind>(kind_value);
  const int servers = group_.servers();
  const torch::Tensor gradients =
      kind == MessageKind::Push ? flatten_gradients(parameters_) : torch::zeros({total_}, torch::kFloat);
  PushResult result;

  // One send and one receive per server, each on its pair's own thread, so
  // the servers are served in parallel.
  std::vector<torch::Tensor> replies;
  std::vector<WorkPtr> sends, receives;
  for (int server = 0; server < servers; ++server) {
    const auto piece = shard_range(total_, servers, server);
    torch::Tensor message = make_message(piece.count);
    write_header(message, {.kind = kind,
                           .worker = group_.worker_index(),
                           .clock = pushes_,
                           .version = versions_[static_cast<size_t>(server)],
                           .lr = lr,
                           .flags = flags});
    payload(message).copy_(gradients.narrow(0, piece.offset, piece.count));
    const CommPtr& pair = group_.pair(server);
    sends.push_back(pair->send(message, 1));
    replies.push_back(make_message(piece.count));
    receives.push_back(pair->recv(replies.back(), 1));
  }

  const auto timeout = wait_limit(*group_.world());
  const auto expected = kind == MessageKind::Push ? MessageKind::Params : MessageKind::Final;
  torch::Tensor flat = torch::empty({total_}, torch::kFloat);
  for (int server = 0; server < servers; ++server) {
    auto who = [&](const char* what) {
      return "parameter-server worker " + std::to_string(group_.worker_index()) + " (world rank " +
             std::to_string(group_.world()->rank()) + "): " + what + " server " + std::to_string(server) +
             " (world rank " + std::to_string(group_.server_rank(server)) + ")";
    };
    const std::string hint =
        kind == MessageKind::Push && group_.options().mode != Mode::Async
            ? ": that server probably died or is stuck, or (sync, ssp) another worker is that much slower"
            : kind == MessageKind::Push ? ": that server probably died or is stuck"
                                        : ": they come once every worker has called finish(); another worker is "
                                          "still training, stuck or dead";
    wait_within(*sends[static_cast<size_t>(server)], timeout,
                [&] { return who(kind == MessageKind::Push ? "could not push its gradients to" : "could not tell it is done to"); },
                ": that server probably died or is stuck");
    wait_within(*receives[static_cast<size_t>(server)], timeout, [&] {
      return who(kind == MessageKind::Push ? "got no parameters back from" : "got no final parameters from");
    }, hint);
    const torch::Tensor& reply = replies[static_cast<size_t>(server)];
    const MessageHeader header = read_header(reply);
    if (header.kind != expected)
      throw CommError(who("a message from") + ": expected " + to_string(expected) + " but got " +
                      to_string(header.kind) + " (see Note [parameter-server messages] in src/ps/wire.h)");
    versions_[static_cast<size_t>(server)] = header.version;
    // The servers agree on a step's norm and skip (they exchange them; with
    // backup workers only one server may use them, so those need one server).
    if (server == 0) result = {.grad_norm = header.grad_norm, .skipped = (header.flags & kSkipped) != 0};
    const auto piece = shard_range(total_, servers, server);
    flat.narrow(0, piece.offset, piece.count).copy_(payload(reply));
  }
  copy_into_parameters(flat, parameters_);
  return result;
}

}  // namespace dtrain::ps
