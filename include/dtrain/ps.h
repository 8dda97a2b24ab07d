// Parameter server: asynchronous data parallelism over the Communicator.
//
// Roles. Of N = W + S ranks of the world, ranks 0..W-1 are workers and the
// last S ranks (W..N-1) are servers. Server j owns the contiguous piece
// shard_range(P, S, j) of the flat parameter vector (P = total number of
// parameter elements, in module parameters() order) and the optimizer state
// for it: a real torch::optim optimizer over that piece, so updates follow
// torch's SGD/AdamW exactly.
//
// A step, on a worker: forward and backward through the plain module, then
// Worker::push_and_pull(lr) sends each server its slice of this worker's
// gradients and copies the parameters the servers reply with into the
// module. On a server: serve() receives pushes and applies them:
//   - Mode::Sync: once the pushes of W - backup_workers workers for the
//     server's current step have arrived, their average is applied (with no
//     backup workers this is exactly DDP); late pushes for a step already
//     applied are dropped and counted, and their worker gets the current
//     parameters at once, so it continues at the current step.
//   - Mode::Async: every push is applied at once and answered with the new
//     parameters.
//   - Mode::SSP: as Async, but a worker that has made c pushes gets its reply
//     only while c - (fewest pushes of any worker not yet done) <= staleness.
// Every applied gradient is recorded with its staleness: the server's version
// (updates applied so far) when it is applied minus the version of the
// parameters the worker computed it on.
//
// Shutdown: each worker calls finish(), which tells every server it is done
// and receives the final parameters once all workers are done; serve()
// returns then. Every wait is bounded by the communicator's timeout
// (DTRAIN_TIMEOUT) and fails with a CommError naming the peer.
//
// Gradient scaling: push what Note [global batch loss] in
// src/train/trainer.cpp prescribes (each worker backpropagates its loss sum
// times W / B, with W the number of workers): Sync then averages to the
// global-batch gradient, and in Async/SSP each push is a full-size step.
#pragma once

#include <dtrain/comm.h>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dtrain::ps {

enum class Mode { Sync, Async, SSP };
const char* to_string(Mode mode);

struct Options {
  Mode mode = Mode::Sync;
  int servers = 1;         // S: the last S ranks of the world; 1 <= S < world size
  int staleness = 0;       // SSP only: the bound s >= 0
  int backup_workers = 0;  // Sync only: k, 0 <= k < W; step t uses the first W - k pushes
  // > 0: clip each update's gradient to this global L2 norm. Sync: the
  // averaged step (the servers agree on its norm over the servers'
  // communicator), as DDP clips the global batch's gradient; Async/SSP: each
  // push (its worker clips it: a push is a whole update).
  double max_grad_norm = 0;
  // Leave out an update whose loss or gradient norm is not finite instead of
  // applying it. Sync: the whole step is skipped when any contributor's loss
  // or the averaged gradient's norm is not finite (the version still
  // advances, as a skipped DDP step still counts); Async/SSP: that push.
  bool skip_nonfinite = false;
};

// Throws std::invalid_argument when `options` cannot run on `world_size` ranks.
void check_options(const Options& options, int world_size);

// The communicators of one parameter-server job. Construct on every rank of
// `world` at the same point (collective: it splits the world).
//
// Note [one communicator per worker-server pair]
// A Communicator runs its operations one at a time in issue order, and a
// recv must name its source, so one communicator cannot wait for "whichever
// worker pushes first": a recv posted for worker 0 would hold up a push from
// worker 1 behind it. So every (worker, server) pair gets its own two-rank
// communicator, split from the world: a server keeps one recv posted per
// worker, each on its own communicator thread, and polls their Work handles
// (Work::is_completed), taking pushes in whatever order they arrive. On one
// pair, messages alternate (push, reply, push, reply, ..., done, final), so a
// server queues a reply before it posts that worker's next recv and never
// the other way round. Threads: each communicator has a communication thread
// and a watchdog thread, so a server holds W pair communicators (2W threads)
// and a worker S of them (2S threads) besides the world and the workers-only
// (on workers) or servers-only (on servers) communicator: at W=3,S=1 the
// server has 10 and each worker 6; at W=2,S=2 every rank has 8. Building the
// pairs takes W*S splits of the world, once.
class Group {
 public:
  Group(CommPtr world, const Options& options);

  const Options& options() const { return options_; }
  int workers() const { return workers_; }
  int servers() const { return options_.servers; }
  bool is_worker() const { return worker_index_ >= 0; }
  bool is_server() const { return server_index_ >= 0; }
  int worker_index() const { return worker_index_; }  // 0..W-1 on workers, else -1
  int server_index() const { return server_index_; }  // 0..S-1 on servers, else -1
  int server_rank(int server) const { return workers_ + server; }  // in the world

  const CommPtr& world() const { return world_; }
  // The workers only (nullptr on servers): for the loss all-reduce and
  // evaluation, which servers take no part in.
  const CommPtr& workers_comm() const { return workers_comm_; }
  // The servers only (nullptr on workers): for agreeing on a sync step's
  // gradient norm (Options::max_grad_norm, skip_nonfinite).
  const CommPtr& servers_comm() const { return servers_comm_; }
  // Worker: the pair with server j. Server: the pair with worker w. In both
  // the worker is rank 0 and the server rank 1.
  const CommPtr& pair(int peer_index) const;

 private:
  CommPtr world_;
  Options options_;
  int workers_ = 0;
  int worker_index_ = -1;
  int server_index_ = -1;
  CommPtr workers_comm_;
  CommPtr servers_comm_;
  std::vector<CommPtr> pairs_;  // by server index (worker) or worker index (server)
};

// One applied gradient (or one dropped push: see ServerReport::dropped).
struct StalenessRecord {
  int worker = 0;
  int64_t clock = 0;            // the worker's pushes before this one
  int64_t read_version = 0;     // version of the parameters it was computed on
  int64_t applied_version = 0;  // server version when applied (before the increment)
  int64_t staleness = 0;        // applied_version - read_version
  // clock minus the fewest pushes of any worker not yet done, when this push
  // arrived: how far ahead of the slowest worker it was computed (SSP
  // guarantees <= staleness bound).
  int64_t clock_lead = 0;
};

// One step a Sync server applied: the workers whose pushes it averaged, in
// arrival order.
struct AppliedStep {
  int64_t version = 0;
  std::vector<int> contributors;
};

struct ServerReport {
  int64_t version = 0;   // updates applied
  int64_t pushes = 0;    // pushes received
  int64_t dropped = 0;   // Sync with backup workers: late pushes discarded
  int64_t skipped = 0;   // Options::skip_nonfinite: steps (Sync) or pushes (Async/SSP) left out
  std::vector<StalenessRecord> records;  // one per applied push, in order
  std::vector<AppliedStep> steps;        // Sync only
  int64_t max_staleness() const;
  double mean_staleness() const;  // 0 without records
};

// Builds this server's optimizer over its one parameter piece, e.g.
//   [&](std::vector<torch::Tensor> p) { return train::make_optimizer(p, cfg); }
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

// One parameter's part of a server's piece: elements [begin, end) of the
// flattened parameter number `index` (in the order the parameters were
// given), as the 1-D tensor the server's optimizer updates (a view of the
// server's piece: checkpoints save and load through it).
struct ServerSlice {
  size_t index = 0;
  int64_t begin = 0, end = 0;
  torch::Tensor values;
};

// Server `group.server_index()`. Constructing it is collective with the
// workers' Worker constructor: `parameters` (a model of the same
// architecture; float32) fix the layout, and every server starts from world
// rank 0's values. The learning rate of each update is the one the pushing
// worker passed to push_and_pull.
class Server {
 public:
  Server(const Group& group, const std::vector<torch::Tensor>& parameters, const OptimizerFactory& make_optimizer);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // This server's piece, one slice per parameter it overlaps, and the
  // optimizer over those slices: what a checkpoint saves and a resume loads
  // (between construction and run()).
  const std::vector<ServerSlice>& slices() const;
  torch::optim::Optimizer& optimizer();
  // Resuming from a checkpoint of step `step` (after loading the slices and
  // the optimizer, before run()): the server's version and every worker's
  // push count start there. Every worker calls Worker::resume_at(step).
  // (Async/SSP count a version per applied push, about W per step, so the
  // resumed versions are lower than the uninterrupted run's; staleness is a
  // difference of versions and is unaffected.)
  void resume_at(int64_t step);

  // Serves until every worker has called finish(). Whenever every running
  // worker has called Worker::announce_checkpoint(step), at_checkpoint(step)
  // runs (collective with those workers, e.g. a save over the world), and
  // then serving goes on.
  ServerReport run(const std::function<void(int64_t step)>& at_checkpoint = {});

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Server(group, parameters, make_optimizer).run(): a server without
// checkpoints.
ServerReport serve(const Group& group, const std::vector<torch::Tensor>& parameters,
                   const OptimizerFactory& make_optimizer);

// The worker side. Construct with the module's parameters (float32, any
// device) on every worker while the servers enter serve(); the module starts
// from world rank 0's values.
class Worker {
 public:
  Worker(const Group& group, std::vector<torch::Tensor> parameters);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // What became of a push: the gradient norm before clipping (0 unless
  // Options::max_grad_norm or skip_nonfinite asked for it; sync: the
  // averaged step's, async/ssp: this push's) and whether the update was left
  // out (Options::skip_nonfinite).
  struct PushResult {
    double grad_norm = 0;
    bool skipped = false;
  };

  // After backward: pushes this worker's gradients (a missing .grad() counts
  // as zeros), waits for the servers' replies and copies the parameters they
  // hold into the module. `lr` is the learning rate the servers use for it;
  // `loss_finite` says whether this worker's loss was finite (for
  // Options::skip_nonfinite).
  PushResult push_and_pull(double lr, bool loss_finite = true);

  // Between pushes: tells every server this worker has reached `step` and
  // will now take part in a checkpoint (collective with the servers'
  // at_checkpoint; see Server::run). Every worker announces the same steps.
  void announce_checkpoint(int64_t step);

  // The step to compute next: the version of the parameters it holds (the
  // lowest over servers). Sync: the global step, which jumps ahead for a
  // worker whose push came too late (backup workers); Async/SSP: this worker's
  // own push count. Loop `while (worker.next_step() < total)`.
  int64_t next_step() const;
  // Resuming from a checkpoint of step `step`, before the first push (see
  // Server::resume_at).
  void resume_at(int64_t step);
  int64_t pushes() const { return pushes_; }

  // Tells every server this worker is done and waits (bounded) until all
  // workers are: then the module holds the final server parameters, the same
  // on every worker. Call once, on every worker; push_and_pull may not follow.
  void finish();

 private:
  PushResult exchange(int kind, double lr, int32_t flags);

  const Group& group_;
  std::vector<torch::Tensor> parameters_;
  int64_t total_ = 0;
  std::vector<int64_t> versions_;  // by server
  int64_t pushes_ = 0;
  bool finished_ = false;
};

// Staleness and drop counts of the whole job: collective over the world (call
// on every rank after serve() / finish(); workers pass nullptr).
struct Summary {
  int64_t updates = 0;         // records over all servers
  int64_t max_staleness = 0;
  double mean_staleness = 0;
  int64_t dropped = 0;         // the most any server dropped
  // The most pushes any applied gradient's worker was ahead of the slowest
  // running worker (StalenessRecord::clock_lead): what SSP's --staleness
  // bounds. max_staleness counts server versions instead, which grow once
  // per applied push of any worker, so it may exceed the bound.
  int64_t max_clock_lead = 0;
};
Summary summarize(const Group& group, const ServerReport* report);

}  // namespace dtrain::ps
