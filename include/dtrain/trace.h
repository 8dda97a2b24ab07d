// Per-rank timeline tracing: spans, instants and counters recorded in memory
// and written as one Chrome trace-event JSON file that opens in Perfetto
// (https://ui.perfetto.dev) or chrome://tracing: one process per rank, one
// track per thread (the training thread, each communicator's thread).
// This header records (every layer does, the communicator included); writing
// the file gathers the ranks' events over a Communicator, so it lives a layer
// above, in dtrain/trace_writer.h.
//
//   dtrain::trace::start(world->rank());        // on the training thread
//   for (...) {
//     dtrain::trace::Span step("step", dtrain::trace::category::step, {{"step", i}});
//     { dtrain::trace::Span s("forward", dtrain::trace::category::compute);  ... }
//     ...
//   }
//   dtrain::trace::write("run.trace.json", *world);  // dtrain/trace_writer.h; collective
//   // then: dtrain trace summary run.trace.json
//
// Tracing is off by default; while off, every recording call costs one
// relaxed atomic load. Timestamps come from CLOCK_MONOTONIC, so the ranks of
// one machine share a time base and their tracks line up.
//
// Note [trace names]: the spans dtrain records, and what the summary reads.
//   category "step":    "step" around one training step (the trainer).
//   category "compute": "forward", "backward", "optimizer_step" (the trainer);
//                       "unit_forward", "unit_backward" with args unit, name
//                       (FSDP, one per unit; a unit's backward runs from its
//                       pre-backward hook until its gradients are reduced);
//                       "ddp_backward" (DDP: from the first gradient hook to
//                       the end of the end-of-backward callback).
//   category "comm":    one span per communicator operation, named by the op
//                       ("all_reduce", "all_gather", "reduce_scatter",
//                       "broadcast", "barrier", "split", "send", "recv"),
//                       on the thread that ran it, with args bytes (the full
//                       buffer), seq, and the issuer's label (unit for FSDP,
//                       bucket for DDP; see trace::Label).
//   category "wait":    "wait" for every Work::wait() (near zero long when
//                       the operation had already finished), with args op
//                       and the label: the communication the training
//                       thread could not hide.
//   category "device_compute", "device_comm", "device_wait": what a CUDA
//                       stream did, timed by events on the device
//                       (src/common/device_spans.h), each on a track of its
//                       own named by the stream's role ("cuda compute",
//                       "cuda all-gather", "cuda reduce-scatter", "cuda
//                       all-reduce"): the trainer's forward, backward and
//                       optimizer step on the compute stream; every
//                       collective FSDP and DDP issue on a communication
//                       stream (Note [communication streams]), timed by the
//                       communicator from where its stream reaches it to its
//                       result, with the unit or bucket label; and "wait"
//                       where the compute
//                       stream stalls for a communication stream. The
//                       summary's device overlap is read from these.
//   instants:           "bucket_ready" (DDP: a gradient bucket is launched).
//   counters:           "live_bytes" (memory::live_bytes(), when the tracking
//                       allocator is installed), sampled after each FSDP
//                       unit's forward and backward, after DDP's backward,
//                       and wherever sample_memory() is called (the trainer:
//                       at the end of each step).
// Only the categories matter to the summary; names are for people.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

namespace dtrain::trace {

namespace category {
inline constexpr const char* step = "step";
inline constexpr const char* compute = "compute";
inline constexpr const char* comm = "comm";
inline constexpr const char* wait = "wait";
inline constexpr const char* device_compute = "device_compute";
inline constexpr const char* device_comm = "device_comm";
inline constexpr const char* device_wait = "device_wait";
}  // namespace category

// One argument of an event: a number, or a text that must outlive the trace
// (a string literal, or a string from intern()).
struct Arg {
  const char* key = nullptr;
  int64_t number = 0;
  const char* text = nullptr;

  Arg() = default;
  template <typename Integer, std::enable_if_t<std::is_integral_v<Integer>, int> = 0>
  Arg(const char* key_in, Integer value) : key(key_in), number(static_cast<int64_t>(value)) {}
  Arg(const char* key_in, const char* value) : key(key_in), text(value) {}
};
inline constexpr int kMaxArgs = 4;

namespace detail {
extern std::atomic<bool> g_recording;
}
// Whether events are being recorded now.
inline bool enabled() noexcept { return detail::g_recording.load(std::memory_order_relaxed); }

// Starts recording (again) for rank `rank`, dropping what an earlier start()
// recorded. The calling thread is named "train" unless it already has a name.
void start(int rank);
// Stops recording; what was recorded stays until write() or the next start().
void stop();

// Names this thread's track ("comm", ...). Works before start(). `name`
// must outlive the trace (a literal or intern()).
void set_thread_name(const char* name);
// A copy of `text` that lives as long as the process, for event texts.
const char* intern(const std::string& text);

// Nanoseconds on CLOCK_MONOTONIC.
int64_t now_ns();

// Records one span from construction to destruction on this thread. A null
// name records nothing (for spans that are recorded only sometimes).
class Span {
 public:
  Span(const char* name, const char* category, std::initializer_list<Arg> args = {}) {
    if (name && enabled()) begin(name, category, args);
  }
  ~Span() {
    if (name_) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  bool active() const { return name_ != nullptr; }
  // Adds an argument (ignored when inactive or when kMaxArgs are set).
  void add(const Arg& arg) {
    if (name_ && arg_count_ < kMaxArgs) args_[arg_count_++] = arg;
  }

 private:
  void begin(const char* name, const char* category, std::initializer_list<Arg> args);
  void end();

  const char* name_ = nullptr;
  const char* category_ = nullptr;
  int64_t start_ns_ = 0;
  int arg_count_ = 0;
  Arg args_[kMaxArgs];
};

// A span that began at `start_ns` (from now_ns()) and ends now, for spans
// that begin and end in different calls (FSDP's unit backward).
void complete(const char* name, const char* category, int64_t start_ns, std::initializer_list<Arg> args = {});
void instant(const char* name, const char* category, std::initializer_list<Arg> args = {});
void counter(const char* name, int64_t value);
// Records counter "live_bytes" when memory::install_tracking_allocator() ran.
void sample_memory();

// What a communicator operation is issued for (a unit, a bucket), copied
// into its span and its wait's span. Set by the issuing code around the call
// that issues the operation; thread-local, nestable.
struct LabelValue {
  const char* key = nullptr;   // "unit", "bucket"
  int64_t number = 0;
  const char* name = nullptr;  // optional text, e.g. the unit's module path
};
class Label {
 public:
  Label(const char* key, int64_t number, const char* name = nullptr);
  ~Label();
  Label(const Label&) = delete;
  Label& operator=(const Label&) = delete;

 private:
  LabelValue previous_;
};
LabelValue current_label();
// Adds the label's arguments to `span`.
void add_label(Span& span, const LabelValue& label);

}  // namespace dtrain::trace
