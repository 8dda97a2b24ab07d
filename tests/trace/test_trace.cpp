// Timeline traces (include/dtrain/trace.h): a short traced FSDP run and a
// short traced DDP run write one valid Chrome trace file with the spans of
// Note [trace names] on every rank, spans nest on every thread, and the
// summary's numbers add up (Note [trace summary]). The files stay in
// $DTRAIN_TRACE_TEST_DIR for the `dtrain trace summary` CLI tests.
//
// With --measure it instead prints the step time of a small FSDP GPT run with
// tracing off and on (interleaved rounds) and their ratio: the overhead.
#include <dtrain/ddp.h>
#include <dtrain/fsdp.h>
#include <dtrain/memory.h>
#include <dtrain/models.h>
#include <dtrain/trace.h>
#include <dtrain/trace_writer.h>
#include <dtrain/trace_summary.h>

#include "../common/multirank_gtest.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace trace = dtrain::trace;
using dtrain::testing::world;
using dtrain::testing::world_ptr;
using nlohmann::json;

std::string output_dir() {
  const char* dir = std::getenv("DTRAIN_TRACE_TEST_DIR");
  const std::string path = dir && *dir ? dir : ".";
  std::filesystem::create_directories(path);
  return path;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return json::parse(text.str());  // throws (failing the test) when not JSON
}

int64_t to_ns(const json& microseconds) { return std::llround(microseconds.get<double>() * 1000.0); }

dtrain::models::GPTConfig tiny_gpt() { return {.vocab_size = 256, .seq_len = 16, .n_layer = 2, .n_embd = 32, .n_head = 2}; }

// One training step with the spans the trainer records (Note [trace names]).
template <typename Forward>
void traced_step(int step, torch::optim::Optimizer& optimizer, Forward forward) {
  const trace::Span span("step", trace::category::step, {{"step", step}});
  optimizer.zero_grad();
  torch::Tensor loss;
  {
    const trace::Span phase("forward", trace::category::compute);
    loss = forward();
  }
  {
    const trace::Span phase("backward", trace::category::compute);
    loss.backward();
  }
  {
    const trace::Span phase("optimizer_step", trace::category::compute);
    optimizer.step();
  }
  trace::sample_memory();
}

torch::Tensor gpt_step_loss(dtrain::FullyShardedDataParallel<dtrain::models::GPT>& fsdp, int step) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(100 * step + world().rank());
  auto tokens = torch::randint(0, 256, {4, tiny_gpt().seq_len + 1}, generator);
  auto logits = fsdp(tokens.narrow(1, 0, tiny_gpt().seq_len));
  return torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), tokens.narrow(1, 1, tiny_gpt().seq_len).reshape({-1}));
}

constexpr int kSteps = 3;

// Trains a tiny GPT under FSDP (full sharding unless `options` says
// otherwise) with tracing on; returns the trace path, output_dir()/`file`.
std::string traced_fsdp_run(dtrain::FSDPOptions options = {.strategy = dtrain::Sharding::Full},
                            const std::string& file = "fsdp.trace.json") {
  dtrain::memory::install_tracking_allocator();
  torch::manual_seed(0);
  dtrain::models::GPT model(tiny_gpt());
  auto fsdp = dtrain::fully_shard(model, world_ptr(), options);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  trace::start(world().rank());
  for (int step = 0; step < kSteps; ++step) traced_step(step, optimizer, [&] { return gpt_step_loss(fsdp, step); });
  const auto path = output_dir() + "/" + file;
  trace::write(path, *world_ptr());
  return path;
}

// Trains a small MLP under DDP (several buckets) with tracing on.
std::string traced_ddp_run() {
  torch::manual_seed(0);
  dtrain::models::MLP model(std::vector<int64_t>{64, 64});
  dtrain::DDPOptions options;
  options.bucket_cap_bytes = 64 << 10;
  options.first_bucket_cap_bytes = 16 << 10;
  dtrain::DistributedDataParallel ddp(model, world_ptr(), options);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  trace::start(world().rank());
  for (int step = 0; step < kSteps; ++step) {
    traced_step(step, optimizer, [&] {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(100 * step + world().rank());
      auto images = torch::rand({8, 1, 28, 28}, generator);
      auto labels = torch::randint(0, 10, {8}, generator);
      return torch::cross_entropy_loss(ddp(images), labels);
    });
  }
  const auto path = output_dir() + "/ddp.trace.json";
  trace::write(path, *world_ptr());
  return path;
}

// What a trace says about one rank.
struct RankView {
  std::set<std::string> names;             // of spans, instants and counters
  std::set<std::string> thread_names;
  std::map<std::string, int> spans_with_label;  // op name -> spans carrying a unit/bucket arg
};

std::map<int, RankView> view_by_rank(const json& trace_json, const std::string& label_key) {
  std::map<int, RankView> ranks;
  for (const auto& event : trace_json["traceEvents"]) {
    auto& rank = ranks[event["pid"].get<int>()];
    const auto phase = event["ph"].get<std::string>();
    if (phase == "M") {
      if (event["name"] == "thread_name") rank.thread_names.insert(event["args"]["name"].get<std::string>());
      continue;
    }
    const auto name = event["name"].get<std::string>();
    rank.names.insert(name);
    if (event.contains("args") && event["args"].contains(label_key)) ++rank.spans_with_label[name];
  }
  return ranks;
}

// The format every event must follow, and proper nesting of the spans of
// each thread (a span that starts inside another ends inside it too).
void expect_well_formed(const json& trace_json) {
  ASSERT_TRUE(trace_json.is_object());
  EXPECT_EQ(trace_json.value("displayTimeUnit", ""), "ms");
  ASSERT_TRUE(trace_json.contains("traceEvents") && trace_json["traceEvents"].is_array());
  std::map<std::pair<int, int>, std::vector<std::pair<int64_t, int64_t>>> spans_by_thread;
  for (const auto& event : trace_json["traceEvents"]) {
    ASSERT_TRUE(event.contains("ph") && event.contains("pid") && event.contains("tid") && event.contains("name"))
        << event.dump();
    if (event["ph"] == "M") continue;
    ASSERT_TRUE(event.contains("ts") && event["ts"].is_number()) << event.dump();
    if (event["ph"] != "X") continue;
    ASSERT_TRUE(event.contains("dur") && event["dur"].is_number()) << event.dump();
    EXPECT_GE(event["dur"].get<double>(), 0.0) << event.dump();
    EXPECT_TRUE(event.contains("cat")) << event.dump();
    const int64_t start = to_ns(event["ts"]);
    spans_by_thread[{event["pid"].get<int>(), event["tid"].get<int>()}].push_back({start, start + to_ns(event["dur"])});
  }
  for (auto& [thread, spans] : spans_by_thread) {
    std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    });
    std::vector<int64_t> open_ends;
    int improper = 0;
    for (const auto& [start, end] : spans) {
      while (!open_ends.empty() && open_ends.back() <= start) open_ends.pop_back();
      if (!open_ends.empty() && end > open_ends.back()) ++improper;
      open_ends.push_back(end);
    }
    EXPECT_EQ(improper, 0) << "spans overlap without nesting on rank " << thread.first << " thread " << thread.second;
  }
}

void expect_summary_adds_up(const std::string& path, int world_size) {
  const auto ranks = trace::summarize_file(path);
  ASSERT_EQ(static_cast<int>(ranks.size()), world_size);
  for (int r = 0; r < world_size; ++r) {
    const auto& s = ranks[r];
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(s.rank, r);
    EXPECT_GT(s.wall_us, 0);
    EXPECT_GT(s.compute_us, 0);
    EXPECT_GT(s.comm_us, 0);
    EXPECT_GE(s.other_us, 0);
    EXPECT_NEAR(s.compute_us + s.exposed_comm_us + s.other_us, s.wall_us, 1e-6 * s.wall_us);
    EXPECT_GE(s.overlap, 0.0);
    EXPECT_LE(s.overlap, 1.0);
    EXPECT_GE(s.comm_us, s.exposed_comm_us);
    EXPECT_EQ(s.steps, kSteps);
    EXPECT_GT(s.collectives, 0);
    EXPECT_GT(s.collective_bytes, 0);
  }
}

void expect_names(const RankView& rank, const std::vector<std::string>& expected, int pid) {
  for (const auto& name : expected) EXPECT_TRUE(rank.names.count(name)) << "rank " << pid << " has no '" << name << "'";
}

TEST(Trace, FSDPRunWritesOneFileWithEveryRanksUnitsAndCollectives) {
  const auto path = traced_fsdp_run();
  if (world().rank() != 0) return;  // rank 0 reads the one file for all ranks
  const auto trace_json = read_json(path);
  expect_well_formed(trace_json);
  const auto ranks = view_by_rank(trace_json, "unit");
  ASSERT_EQ(static_cast<int>(ranks.size()), world().size());
  for (const auto& [pid, rank] : ranks) {
    expect_names(rank, {"step", "forward", "backward", "optimizer_step", "unit_forward", "unit_backward",
                        "live_bytes"}, pid);
    EXPECT_TRUE(rank.thread_names.count("train")) << "rank " << pid;
    if (world().size() > 1) {
      expect_names(rank, {"all_gather", "reduce_scatter", "wait"}, pid);
      EXPECT_TRUE(rank.thread_names.count("comm")) << "rank " << pid;
      EXPECT_GT(rank.spans_with_label.count("all_gather") ? rank.spans_with_label.at("all_gather") : 0, 0)
          << "all_gather spans name their unit on rank " << pid;
    }
    // Units: the root and one per GPT block, each forward and backward once per step.
    EXPECT_EQ(rank.spans_with_label.at("unit_forward"), kSteps * (1 + tiny_gpt().n_layer)) << "rank " << pid;
    EXPECT_EQ(rank.spans_with_label.at("unit_backward"), kSteps * (1 + tiny_gpt().n_layer)) << "rank " << pid;
  }
  if (world().size() > 1) expect_summary_adds_up(path, world().size());
}

// ZeRO-2 keeps units gathered from forward to backward, and activation
// checkpointing recomputes each unit's forward inside its backward: the
// recomputation adds no unit_forward span (it is part of the unit's backward),
// and every span still nests on its thread.
TEST(Trace, GradOpWithActivationCheckpointingNestsUnitSpans) {
  dtrain::FSDPOptions options;
  options.strategy = dtrain::Sharding::GradOp;
  options.activation_checkpointing = true;
  const auto path = traced_fsdp_run(options, "fsdp-gradop-checkpointed.trace.json");
  if (world().rank() != 0) return;
  const auto trace_json = read_json(path);
  expect_well_formed(trace_json);
  const auto ranks = view_by_rank(trace_json, "unit");
  ASSERT_EQ(static_cast<int>(ranks.size()), world().size());
  for (const auto& [pid, rank] : ranks) {
    EXPECT_EQ(rank.spans_with_label.at("unit_forward"), kSteps * (1 + tiny_gpt().n_layer)) << "rank " << pid;
    EXPECT_EQ(rank.spans_with_label.at("unit_backward"), kSteps * (1 + tiny_gpt().n_layer)) << "rank " << pid;
    if (world().size() > 1) expect_names(rank, {"all_gather", "reduce_scatter"}, pid);
  }
  if (world().size() > 1) expect_summary_adds_up(path, world().size());
}

TEST(Trace, DDPRunWritesBucketAllReducesAndWaits) {
  const auto path = traced_ddp_run();
  if (world().rank() != 0) return;
  const auto trace_json = read_json(path);
  expect_well_formed(trace_json);
  const auto ranks = view_by_rank(trace_json, "bucket");
  ASSERT_EQ(static_cast<int>(ranks.size()), world().size());
  if (world().size() == 1) return;  // DDP on one rank communicates nothing
  for (const auto& [pid, rank] : ranks) {
    expect_names(rank, {"step", "forward", "backward", "optimizer_step", "ddp_backward", "bucket_ready",
                        "all_reduce", "wait"}, pid);
    EXPECT_GE(rank.spans_with_label.count("all_reduce") ? rank.spans_with_label.at("all_reduce") : 0, 2 * kSteps)
        << "every bucket's all_reduce names its bucket on rank " << pid;
  }
  expect_summary_adds_up(path, world().size());
}

TEST(Trace, NothingIsRecordedWhileStopped) {
  const auto path = output_dir() + "/stopped.rank" + std::to_string(world().rank()) + ".trace.json";
  trace::start(world().rank());
  { const trace::Span recorded("recorded_span", trace::category::compute); }
  trace::stop();
  { const trace::Span ignored("span_while_stopped", trace::category::compute); }
  trace::instant("instant_while_stopped", "test");
  trace::counter("counter_while_stopped", 1);
  trace::write_local(path);
  std::set<std::string> names;
  const auto trace_json = read_json(path);
  for (const auto& event : trace_json["traceEvents"]) names.insert(event["name"].get<std::string>());
  EXPECT_TRUE(names.count("recorded_span"));
  EXPECT_FALSE(names.count("span_while_stopped"));
  EXPECT_FALSE(names.count("instant_while_stopped"));
  EXPECT_FALSE(names.count("counter_while_stopped"));
  if (!::testing::Test::HasFailure()) std::filesystem::remove(path);
}

TEST(Trace, WriteToAMissingDirectoryFailsOnEveryRankNamingThePath) {
  trace::start(world().rank());
  try {
    trace::write("/nonexistent-dtrain-dir/run.trace.json", *world_ptr());
    ADD_FAILURE() << "write() succeeded";
  } catch (const std::runtime_error& error) {
    const std::string what = error.what();
    if (world().rank() == 0) EXPECT_NE(what.find("/nonexistent-dtrain-dir/run.trace.json"), std::string::npos) << what;
    else EXPECT_NE(what.find("rank 0 could not write"), std::string::npos) << what;
  }
}

// Hand-made events with known answers: compute [0,100] us on the training
// thread with a wait [40,60], an all_gather [30,55] on the comm thread.
TEST(TraceSummary, FollowsItsDefinitionsOnKnownIntervals) {
  const std::string text = R"({"traceEvents":[
    {"ph":"M","name":"thread_name","pid":3,"tid":1,"args":{"name":"train"}},
    {"ph":"M","name":"thread_name","pid":3,"tid":2,"args":{"name":"comm"}},
    {"ph":"X","name":"step","cat":"step","pid":3,"tid":1,"ts":0,"dur":100},
    {"ph":"X","name":"forward","cat":"compute","pid":3,"tid":1,"ts":0,"dur":100},
    {"ph":"X","name":"wait","cat":"wait","pid":3,"tid":1,"ts":40,"dur":20},
    {"ph":"X","name":"all_gather","cat":"comm","pid":3,"tid":2,"ts":30,"dur":25,"args":{"bytes":1024}},
    {"ph":"X","name":"data","cat":"io","pid":3,"tid":1,"ts":100,"dur":10}
  ],"displayTimeUnit":"ms"})";
  const auto ranks = trace::summarize(text);
  ASSERT_EQ(ranks.size(), 1u);
  const auto& s = ranks[0];
  EXPECT_EQ(s.rank, 3);
  EXPECT_DOUBLE_EQ(s.wall_us, 110);
  EXPECT_DOUBLE_EQ(s.compute_us, 80);       // [0,100] minus the wait
  EXPECT_DOUBLE_EQ(s.exposed_comm_us, 15);  // wait ∩ all_gather = [40,55]
  EXPECT_DOUBLE_EQ(s.other_us, 15);         // 110 - 80 - 15
  EXPECT_DOUBLE_EQ(s.comm_us, 25);
  EXPECT_DOUBLE_EQ(s.overlap, 0.4);
  EXPECT_EQ(s.steps, 1);
  EXPECT_DOUBLE_EQ(s.mean_step_us, 100);
  EXPECT_EQ(s.collectives, 1);
  EXPECT_EQ(s.collective_bytes, 1024);
  EXPECT_EQ(s.waits, 1);
  EXPECT_FALSE(s.device_timed);  // no device_comm span
  EXPECT_DOUBLE_EQ(s.device_overlap, 1);
}

// Device-timed spans on their stream tracks: the compute stream busy over
// [0,100] us, stalled [70,80] for an all-gather that ran [20,75] and a
// reduce-scatter [90,120] never waited for.
TEST(TraceSummary, ReadsTheDeviceSpansOfEveryTrack) {
  const std::string text = R"({"traceEvents":[
    {"ph":"M","name":"thread_name","pid":0,"tid":1,"args":{"name":"train"}},
    {"ph":"M","name":"thread_name","pid":0,"tid":5,"args":{"name":"cuda compute"}},
    {"ph":"M","name":"thread_name","pid":0,"tid":6,"args":{"name":"cuda all-gather"}},
    {"ph":"M","name":"thread_name","pid":0,"tid":7,"args":{"name":"cuda reduce-scatter"}},
    {"ph":"X","name":"forward","cat":"compute","pid":0,"tid":1,"ts":0,"dur":30},
    {"ph":"X","name":"forward","cat":"device_compute","pid":0,"tid":5,"ts":0,"dur":100},
    {"ph":"X","name":"wait","cat":"device_wait","pid":0,"tid":5,"ts":70,"dur":10},
    {"ph":"X","name":"all_gather","cat":"device_comm","pid":0,"tid":6,"ts":20,"dur":55},
    {"ph":"X","name":"reduce_scatter","cat":"device_comm","pid":0,"tid":7,"ts":90,"dur":30}
  ]})";
  const auto ranks = trace::summarize(text);
  ASSERT_EQ(ranks.size(), 1u);
  const auto& s = ranks[0];
  EXPECT_TRUE(s.device_timed);
  EXPECT_DOUBLE_EQ(s.device_compute_us, 90);        // [0,100] minus the stall
  EXPECT_DOUBLE_EQ(s.device_comm_us, 85);           // [20,75] and [90,120]
  EXPECT_DOUBLE_EQ(s.device_exposed_comm_us, 5);    // stall ∩ comm = [70,75]
  EXPECT_DOUBLE_EQ(s.device_overlap, 1.0 - 5.0 / 85.0);
  // The host-side figures ignore the device tracks.
  EXPECT_DOUBLE_EQ(s.compute_us, 30);
  EXPECT_EQ(s.collectives, 0);
  EXPECT_DOUBLE_EQ(s.wall_us, 120);  // any track's spans
}

TEST(TraceSummary, RejectsWhatIsNotATraceWithAClearMessage) {
  auto message_of = [](const std::string& text) -> std::string {
    try {
      trace::summarize(text);
    } catch (const std::invalid_argument& error) {
      return error.what();
    }
    return "(no error)";
  };
  EXPECT_NE(message_of("hello, world").find("not valid JSON"), std::string::npos);
  EXPECT_NE(message_of(R"({"events":[]})").find("no \"traceEvents\" array"), std::string::npos);
  EXPECT_NE(message_of(R"({"traceEvents":[{"ph":"X","pid":0,"ts":"soon","dur":1}]})").find("\"ts\""),
            std::string::npos);
  EXPECT_NE(message_of(R"({"traceEvents":[]})").find("no spans"), std::string::npos);
}

// --measure: step time with tracing off and on, in alternating rounds so that
// drift on a shared machine hits both alike.
int measure_overhead(const dtrain::CommPtr& comm, int rounds, int steps_per_round) {
  torch::manual_seed(0);
  dtrain::models::GPT model(dtrain::models::GPTConfig{.seq_len = 64, .n_layer = 4, .n_embd = 128, .n_head = 4});
  auto fsdp = dtrain::fully_shard(model, comm, {.strategy = dtrain::Sharding::Full});
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  auto run_steps = [&](int count) {
    comm->barrier()->wait();
    const auto begin = std::chrono::steady_clock::now();
    for (int step = 0; step < count; ++step) {
      traced_step(step, optimizer, [&] {
        auto tokens = torch::randint(0, 256, {8, 65});
        auto logits = fsdp(tokens.narrow(1, 0, 64));
        return torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), tokens.narrow(1, 1, 64).reshape({-1}));
      });
    }
    comm->barrier()->wait();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count() / count;
  };
  run_steps(3);  // warm-up
  std::vector<double> off, on, ratios;
  for (int round = 0; round < rounds; ++round) {
    // Off-on, then on-off: neither mode always runs second.
    for (int turn = 0; turn < 2; ++turn) {
      const bool traced = (turn == 0) == (round % 2 == 1);
      if (traced) trace::start(comm->rank());
      (traced ? on : off).push_back(run_steps(steps_per_round));
      trace::stop();
    }
    ratios.push_back(on.back() / off.back());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  if (comm->rank() == 0) {
    std::printf("tracing overhead: FSDP GPT (4 layers, dim 128, seq 64, batch 8/rank), %d ranks, %d rounds x %d steps\n",
                comm->size(), rounds, steps_per_round);
    std::printf("  median step time: off %.2f ms, on %.2f ms; median of per-round on/off ratios %.4f\n",
                median(off), median(on), median(ratios));
  }
  // The cost of one span on this thread, off and on (the bound that the
  // step-time ratio, noisy on a shared machine, cannot resolve).
  auto span_cost_ns = [](int count) {
    const auto begin = std::chrono::steady_clock::now();
    for (int i = 0; i < count; ++i) const trace::Span span("bench", trace::category::compute, {{"i", i}});
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - begin).count() / count;
  };
  const int spans = 200'000;
  const double off_ns = span_cost_ns(spans);
  trace::start(comm->rank());
  const double on_ns = span_cost_ns(spans);
  trace::stop();
  // Events one step records per rank, counted in a trace of one more round.
  const auto path = std::filesystem::temp_directory_path() / "dtrain_trace_overhead.trace.json";
  trace::start(comm->rank());
  run_steps(steps_per_round);
  trace::write(path.string(), *comm);
  if (comm->rank() == 0) {
    int64_t events = 0;
    const auto trace_json = read_json(path.string());
    for (const auto& event : trace_json["traceEvents"]) events += event["ph"] != "M" ? 1 : 0;
    std::filesystem::remove(path);
    const double per_step = static_cast<double>(events) / comm->size() / steps_per_round;
    std::printf("  one span: off %.1f ns, on %.1f ns; %.0f events per step per rank: %.1f us of a %.2f ms step "
                "(%.3f%%)\n",
                off_ns, on_ns, per_step, per_step * on_ns / 1000, median(on), per_step * on_ns / 1e4 / median(on));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // --measure [ROUNDS [STEPS]]
  if (argc > 1 && std::strcmp(argv[1], "--measure") == 0) {
    auto comm = dtrain::init(argc, argv);
    const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
    const int steps = argc > 3 ? std::atoi(argv[3]) : 10;
    return measure_overhead(comm, std::max(rounds, 1), std::max(steps, 1));
  }
  return dtrain::testing::run_multirank_tests(argc, argv);
}
