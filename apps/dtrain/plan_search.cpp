// Note [layout search]
// `dtrain plan --search` enumerates what dtrain train can run on --nproc
// ranks for the given model and batch: every (dp, pp, cp, tp) mesh whose
// degrees multiply to nproc (each dimension only where the model's spec
// has it), sequence parallelism with tp, every planned strategy (hsdp at
// half the engine's ranks, as dtrain train groups it), for a pipeline 1, 2, 4
// and 8 microbatches per stage under 1f1b, gpipe and interleaved (2 chunks
// per rank), and for the sharded strategies prefetch on or off and
// activation checkpointing on or off. What mixed precision, the optimizer
// and the batch are stays the user's: they change the numbers trained, not
// only the speed. Compressed collectives (--fsdp-compress) are left out:
// they change the numbers too, and the memory plan does not count their
// records' buffers (up to 6% more than planned, measured by the test
// plan.search's first version), so a listed layout could outgrow its plan.
// Each candidate is resolved as `dtrain plan` resolves its flags (refusals
// are the planner's and dtrain train's), planned on every pipeline stage, and
// timed (Note [step time], Note [pipeline time]); those over the memory limit
// are dropped and the rest ranked by predicted tokens/s. A listed row is
// checked once more by dtrain train's own flag parser and checks
// (check_train_flags), so its flags run as printed.
#include "plan_search.h"

#include "plan_resolve.h"
#include "plan_time.h"
#include "train.h"
#include "dtrain/model_spec.h"
#include "dtrain/strategy_table.h"
#include "dtrain/train.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

namespace dtrain::cli {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int k = 1; k <= n; ++k)
    if (n % k == 0) d.push_back(k);
  return d;
}

int64_t parse_memory(const std::string& text) {
  const std::string usage = "--device-memory '" + text + "' must be bytes with an optional unit: 80GiB, 512MiB, 24GB";
  size_t used = 0;
  double number = 0;
  try {
    number = std::stod(text, &used);
  } catch (const std::logic_error&) {
    throw std::invalid_argument(usage);
  }
  const std::string unit = text.substr(used);
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "KiB") scale = 1024.0;
  else if (unit == "MiB") scale = 1024.0 * 1024;
  else if (unit == "GiB") scale = 1024.0 * 1024 * 1024;
  else if (unit == "KB") scale = 1e3;
  else if (unit == "MB") scale = 1e6;
  else if (unit == "GB") scale = 1e9;
  if (scale == 0 || !(number > 0)) throw std::invalid_argument(usage);
  return static_cast<int64_t>(number * scale);
}

int64_t default_memory_limit(const PlanFlags& f) {
  const int64_t bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  const int on_host = f.ranks_per_host > 0 ? std::min(f.ranks_per_host, f.nproc) : f.nproc;
  return bytes / on_host;
}

std::string human(int64_t bytes) {
  char text[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(text, sizeof text, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else std::snprintf(text, sizeof text, "%.1f MiB", b / (1024.0 * 1024));
  return text;
}

// One layout: the plan's flags for it and dtrain train's.
struct Candidate {
  PlanFlags flags;
  std::vector<std::string> train_flags;
};

void add_sharded_knobs(const Candidate& base, bool sharded, bool checkpointable, std::vector<Candidate>& out) {
  if (!sharded) {
    out.push_back(base);
    return;
  }
  for (const bool prefetch : {true, false}) {
    for (const bool checkpointing : {false, true}) {
      if (checkpointing && !checkpointable) continue;
      Candidate c = base;
      c.flags.forward_prefetch = prefetch;
      c.flags.backward_prefetch = prefetch ? "pre" : "none";
      c.train_flags.insert(c.train_flags.end(), {"--fsdp-prefetch", prefetch ? "on" : "off"});
      if (checkpointing) {
        c.flags.activation_checkpointing = "on";
        c.train_flags.insert(c.train_flags.end(), {"--activation-checkpointing", "on"});
      }
      out.push_back(std::move(c));
    }
  }
}

std::vector<Candidate> enumerate(const PlanFlags& base, const ModelSpec& spec) {
  std::vector<Candidate> out;
  const int n = base.nproc;
  for (int tp : divisors(n)) {
    if (tp > 1 && !spec.tensor_parallel) continue;
    for (int pp : divisors(n / tp)) {
      if (pp > 1 && !spec.plan_stage_description) continue;
      for (int cp : divisors(n / (tp * pp))) {
        if (cp > 1 && !spec.context_parallel) continue;
        const int dp = n / (tp * pp * cp);
        for (const bool sp : {false, true}) {
          if (sp && tp == 1) continue;
          Candidate mesh;
          mesh.flags = base;
          mesh.flags.tp = tp;
          mesh.flags.pp = pp;
          mesh.flags.cp = cp;
          mesh.flags.sequence_parallel = sp;
          mesh.flags.rank = 0;
          if (tp > 1) mesh.train_flags.insert(mesh.train_flags.end(), {"--tp", std::to_string(tp)});
          if (sp) mesh.train_flags.push_back("--sequence-parallel");
          if (cp > 1) mesh.train_flags.insert(mesh.train_flags.end(), {"--cp", std::to_string(cp)});
          std::vector<Candidate> pipelines;
          if (pp == 1) {
            pipelines.push_back(mesh);
          } else {
            for (int per_stage : {1, 2, 4, 8}) {
              for (const char* schedule : {"1f1b", "gpipe", "interleaved"}) {
                Candidate c = mesh;
                c.flags.microbatches = pp * per_stage;
                c.flags.schedule = schedule;
                c.flags.virtual_stages = std::string(schedule) == "interleaved" ? 2 : 1;
                c.train_flags.insert(c.train_flags.end(), {"--pp", std::to_string(pp), "--microbatches",
                                                           std::to_string(c.flags.microbatches), "--schedule", schedule});
                if (c.flags.virtual_stages > 1) c.train_flags.insert(c.train_flags.end(), {"--virtual-stages", "2"});
                pipelines.push_back(std::move(c));
              }
            }
          }
          for (const Candidate& pipeline : pipelines) {
            for (const auto& row : strategy_table()) {
              if (!row.planned) continue;
              std::vector<int> groups{0};
              if (row.sharding == Sharding::Hybrid) {
                // dtrain train's groups: half the engine's ranks (src/train/strategy.cpp); on fewer than 4
                // ranks, or an odd number, hsdp is fsdp.
                const int world = dp * cp;
                groups.clear();
                if (world >= 4 && world % 2 == 0) groups.push_back(world / 2);
              }
              for (int group : groups) {
                Candidate c = pipeline;
                c.flags.strategy = row.name;
                c.flags.hybrid_group_size = group;
                c.train_flags.insert(c.train_flags.begin(), {"--strategy", row.name});
                add_sharded_knobs(c, row.engine == StrategyEngine::FSDP, static_cast<bool>(spec.checkpointable_blocks),
                                  out);
              }
            }
          }
        }
      }
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> run_flags(const PlanFlags& f) {
  std::vector<std::string> flags{"--model", f.model};
  for (const auto& [key, value] : f.model_options) flags.insert(flags.end(), {"--model-option", key + "=" + value});
  const ModelSpec& spec = find_model(f.model);
  if (spec.token_sequences) {
    flags.insert(flags.end(), {"--gpt-layers", std::to_string(f.gpt_layers), "--gpt-dim", std::to_string(f.gpt_dim),
                               "--gpt-heads", std::to_string(f.gpt_heads), "--seq-len", std::to_string(f.seq_len),
                               "--vocab-size", std::to_string(f.vocab_size)});
    if (f.kv_heads > 0) flags.insert(flags.end(), {"--kv-heads", std::to_string(f.kv_heads)});
    if (f.ffn_dim > 0) flags.insert(flags.end(), {"--ffn-dim", std::to_string(f.ffn_dim)});
    if (f.tie_embeddings) flags.push_back("--tie-embeddings");
  } else if (f.model == "mlp") {
    std::string hidden;
    for (int64_t width : f.mlp_hidden) hidden += (hidden.empty() ? "" : ",") + std::to_string(width);
    flags.insert(flags.end(), {"--mlp-hidden", hidden});
  }
  if (f.batch_size > 0) flags.insert(flags.end(), {"--batch-size", std::to_string(f.batch_size)});
  if (f.mixed_precision != "none") flags.insert(flags.end(), {"--mixed-precision", f.mixed_precision});
  if (!f.optimizer.empty()) flags.insert(flags.end(), {"--optimizer", f.optimizer});
  return flags;
}

SearchResult search_layouts(const PlanFlags& flags) {
  const auto start = std::chrono::steady_clock::now();
  if (flags.link.empty())
    throw std::invalid_argument("--search ranks layouts by their predicted step time: give --link (measure it with "
                                "`dtrain bench collectives --nproc N --json FILE`, then --link FILE)");
  SearchResult result;
  result.memory_limit = flags.device_memory.empty() ? default_memory_limit(flags) : parse_memory(flags.device_memory);
  // The rates once, for every layout: the probes are not repeated.
  const ModelSpec& spec = find_model(flags.model);
  const Resolved first = resolve([&] {
    PlanFlags plain = flags;
    plain.tp = plain.pp = plain.cp = 1;
    plain.sequence_parallel = false;
    plain.microbatches = 1;
    plain.schedule = "1f1b";
    plain.virtual_stages = 1;
    plain.strategy = "ddp";
    plain.activation_checkpointing = "off";
    plain.fsdp_compress = "none";
    plain.hybrid_group_size = 0;
    plain.rank = 0;
    return plain;
  }());
  const plan::ComputeRates rates = first.options.compute;
  const auto candidates = enumerate(flags, spec);
  result.candidates = static_cast<int>(candidates.size());
  std::vector<LayoutRow> fitting;
  for (const Candidate& c : candidates) {
    LayoutRow row;
    try {
      const Resolved r = resolve(c.flags, rates);
      if (r.pp == 1) {
        const plan::Plan p = plan::make_plan(r.model, r.options);
        row.peak_bytes = p.overall_peak_bytes();
        row.time = p.time;
      } else {
        for (const auto& stage : r.stages)
          row.peak_bytes = std::max(row.peak_bytes, plan::make_plan(stage, r.options).overall_peak_bytes());
        row.time = plan::pipeline_step_times(r.stages, r.options)[0];
      }
      if (!row.time.predicted()) throw std::invalid_argument("no time");
      row.tokens_per_second = static_cast<double>(tokens_per_step(r)) / row.time.seconds;
    } catch (const std::invalid_argument&) {
      ++result.refused;
      continue;
    }
    if (row.peak_bytes > result.memory_limit) {
      ++result.over_memory;
      continue;
    }
    row.train_flags = c.train_flags;
    fitting.push_back(std::move(row));
  }
  std::stable_sort(fitting.begin(), fitting.end(),
                   [](const LayoutRow& a, const LayoutRow& b) {
                     if (a.tokens_per_second != b.tokens_per_second) return a.tokens_per_second > b.tokens_per_second;
                     return a.peak_bytes < b.peak_bytes;  // as fast: the one that leaves more memory
                   });
  // dtrain train's own check of every listed row.
  const auto model_flags = run_flags(flags);
  const size_t wanted = flags.top > 0 ? static_cast<size_t>(flags.top) : fitting.size();
  for (auto& row : fitting) {
    if (result.rows.size() == wanted) break;
    std::vector<std::string> args = model_flags;
    args.insert(args.end(), row.train_flags.begin(), row.train_flags.end());
    args.insert(args.end(), {"--nproc", std::to_string(flags.nproc)});
    try {
      check_train_flags(args, flags.nproc);
    } catch (const std::invalid_argument&) {
      ++result.refused;
      continue;
    }
    result.rows.push_back(std::move(row));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

namespace {

std::string joined(const std::vector<std::string>& words) {
  std::string text;
  for (const auto& w : words) text += (text.empty() ? "" : " ") + w;
  return text;
}

}  // namespace

int print_search(const PlanFlags& flags) {
  const SearchResult result = search_layouts(flags);
  const auto model_flags = run_flags(flags);
  if (flags.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& row : result.rows)
      rows.push_back({{"train_flags", row.train_flags},
                      {"step_seconds", row.time.seconds},
                      {"tokens_per_second", row.tokens_per_second},
                      {"peak_bytes", row.peak_bytes},
                      {"compute_seconds", row.time.compute_seconds},
                      {"exposed_communication_seconds", row.time.exposed_communication_seconds},
                      {"bubble_seconds", row.time.bubble_seconds}});
    std::cout << nlohmann::json{{"model_flags", model_flags},
                                {"nproc", flags.nproc},
                                {"memory_limit_bytes", result.memory_limit},
                                {"candidates", result.candidates},
                                {"refused", result.refused},
                                {"over_memory", result.over_memory},
                                {"search_seconds", result.seconds},
                                {"layouts", rows}}
                     .dump(2)
              << std::endl;
    return 0;
  }
  std::printf("dtrain plan --search: %s on %d ranks\n", joined(model_flags).c_str(), flags.nproc);
  std::printf("  %d layouts enumerated in %.2f s: %d not accepted, %d over the memory limit of %s per rank; "
              "the fastest %zu by predicted tokens/s (Note [step time]):\n",
              result.candidates, result.seconds, result.refused, result.over_memory, human(result.memory_limit).c_str(),
              result.rows.size());
  std::printf("  %3s %10s %12s %11s %11s %10s  %s\n", "#", "step ms", "tokens/s", "peak", "exposed ms", "bubble ms",
              "dtrain train flags");
  for (size_t i = 0; i < result.rows.size(); ++i) {
    const auto& row = result.rows[i];
    std::printf("  %3zu %10.2f %12.0f %11s %11.2f %10.2f  %s\n", i + 1, row.time.seconds * 1e3, row.tokens_per_second,
                human(row.peak_bytes).c_str(), row.time.exposed_communication_seconds * 1e3,
                row.time.bubble_seconds * 1e3, joined(row.train_flags).c_str());
  }
  if (result.rows.empty()) {
    std::printf("  no layout fits: a larger --device-memory, more ranks, or a smaller batch\n");
    return 1;
  }
  return 0;
}

}  // namespace dtrain::cli
