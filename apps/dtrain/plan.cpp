#include "plan.h"
#include "plan_resolve.h"
#include "plan_search.h"
#include "plan_time.h"
#include "json_file.h"
#include "train.h"
#include "dtrain/float8.h"
#include "dtrain/model_spec.h"
#include "dtrain/train.h"
#include "train/plan_model.h"

#include "dtrain/pipeline.h"
#include "dtrain/plan.h"
#include "dtrain/strategy_table.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>

namespace dtrain::cli {
namespace {

// "must be >= 1, got '0'" (CLI11 2.1's PositiveNumber spells its range up to DBL_MAX).
CLI::Validator at_least(int64_t bound) {
  return CLI::Validator(
      [bound](std::string& value) -> std::string {
        int64_t number = 0;
        const bool ok = CLI::detail::lexical_cast(value, number) && number >= bound;
        return ok ? "" : "must be an integer >= " + std::to_string(bound) + ", got '" + value + "'";
      },
      ">= " + std::to_string(bound));
}

std::string human(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  char text[32];
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(text, sizeof text, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024) std::snprintf(text, sizeof text, "%.1f MiB", b / (1024.0 * 1024));
  else if (b >= 1024.0) std::snprintf(text, sizeof text, "%.1f KiB", b / 1024.0);
  else std::snprintf(text, sizeof text, "%lld B", static_cast<long long>(bytes));
  return text;
}

nlohmann::json to_json(const plan::MemoryBreakdown& m) {
  return {{"parameters", m.parameters},           {"gathered_parameters", m.gathered_parameters},
          {"gradients", m.gradients},             {"reduction_buffers", m.reduction_buffers},
          {"optimizer_state", m.optimizer_state}, {"activations", m.activations},
          {"checkpoint_staging", m.checkpoint_staging},
          {"total", m.total()}};
}


// The mesh's coordinates of a world rank: (dp, pp, cp, tp), dp outermost and
// tp innermost (as dtrain train's make_mesh lays it out).
int dp_coordinate(const PlanFlags& f, int rank) { return rank / (f.tp * f.cp * f.pp); }
int pp_coordinate(const PlanFlags& f, int rank) { return rank / (f.tp * f.cp) % f.pp; }
int cp_coordinate(const PlanFlags& f, int rank) { return rank / f.tp % f.cp; }

// --cp: what dtrain train refuses (src/train/check_config.cpp), and what the
// planner does not describe yet.
void check_context_parallel_flags(const PlanFlags& f, const ModelSpec& spec) {
  if (f.cp == 1) return;
  const std::string cp = "--cp " + std::to_string(f.cp);
  if (!spec.context_parallel)
    throw std::invalid_argument(cp + " needs a model that runs on sequence shards (ModelSpec::context_parallel), "
                                "which --model " + f.model + "'s spec does not declare");
  if (!spec.plan_description || f.probe)
    throw std::invalid_argument(cp + " is planned from the model's description (ModelSpec::plan_description): the probe "
                                "measures a whole sequence, not a ring's shard" +
                                std::string(f.probe ? "; leave out --probe" : ""));
  if (f.seq_len % (2 * f.cp) != 0)
    throw std::invalid_argument(cp + " needs --seq-len divisible by " + std::to_string(2 * f.cp) +
                                " (each rank holds a head and a tail chunk of 2 x cp equal chunks), got " +
                                std::to_string(f.seq_len) + " (as dtrain train)");
  if (f.sequence_parallel && (f.seq_len / f.cp) % f.tp != 0)
    throw std::invalid_argument("--sequence-parallel with " + cp + " and --tp " + std::to_string(f.tp) +
                                " needs --seq-len divisible by " + std::to_string(f.cp * f.tp) + " (as dtrain train)");
  if (f.activation_checkpointing == "on")
    throw std::invalid_argument(cp + " with --activation-checkpointing on is not planned yet (the recompute passes the "
                                "ring again): plan one of them at a time");
}

void check_pipeline_flags(const PlanFlags& f, const ModelSpec& spec) {
  if (f.pp == 1) {
    if (f.microbatches > 1)
      throw std::invalid_argument("--microbatches splits a pipeline's batch between its stages: it needs --pp N with N > 1");
    if (f.pp_gather != "step")
      throw std::invalid_argument("--pp-gather says how a pipeline stage gathers its units: it needs --pp N with N > 1");
    return;
  }
  if (f.pp_gather != "step" && f.strategy == "ddp")
    throw std::invalid_argument("--pp-gather " + f.pp_gather + " says when a sharded strategy gathers a stage's units: "
                                "it needs --strategy zero1, zero2, fsdp or hsdp, not ddp");
  const std::string pp = "--pp " + std::to_string(f.pp);
  if (!spec.plan_stage_description)
    throw std::invalid_argument(pp + " needs ModelSpec::plan_stage_description, a description of the model's pipeline "
                                "stages, which --model " + f.model + "'s spec does not have");
  if (f.probe)
    throw std::invalid_argument("--probe measures a whole model or a tensor-parallel slice of it, not a pipeline stage: "
                                "leave out --probe or " + pp);
}

// What dtrain train would run: the flags the plan shares with it.
TrainConfig train_config_of(const PlanFlags& f, const ModelSpec& spec) {
  TrainConfig config;
  copy_model_flags(f, config);
  config.tp = f.tp;
  config.sequence_parallel = f.sequence_parallel;
  config.pp = f.pp;
  config.cp = f.cp;
  config.microbatches = f.microbatches;
  config.schedule = f.schedule;
  config.virtual_stages = f.virtual_stages;
  config.data = spec.token_sequences ? "text:/usr/share/games/fortunes" : "fashion-mnist";  // dtrain train's defaults
  return config;
}

// --link and the rates: the step's time (PlanOptions::compute, link, model_link).
void resolve_time(const PlanFlags& f, const TrainConfig& config, Resolved& r,
                  const std::optional<plan::ComputeRates>& rates) {
  if (f.ranks_per_host < 0) throw std::invalid_argument("--ranks-per-host must be at least 1");
  if (f.link.empty()) {
    if (f.ranks_per_host > 0 || f.gemm_gflops > 0 || f.memory_gbps > 0)
      throw std::invalid_argument("--ranks-per-host, --gemm-gflops and --memory-gbps predict a step's time on --link's "
                                  "links: give --link too (`dtrain bench collectives --json FILE` measures them)");
    return;
  }
  const PlanLinks links = parse_links(f.link);
  const MeshPlacement mesh{f.pp, f.cp, f.tp, f.nproc, f.ranks_per_host};
  r.options.link = mesh.engine_crosses_hosts(f.rank) ? links.inter : links.intra;
  r.options.model_link = mesh.model_crosses_hosts(f.rank) ? links.inter : links.intra;
  const int on_host = f.ranks_per_host > 0 ? std::min(f.ranks_per_host, f.nproc) : f.nproc;
  if (rates) {
    r.options.compute = *rates;
    return;
  }
  // The model timed at a data-parallel rank's batch (at least one sample).
  const int64_t batch = std::max<int64_t>(1, r.global_batch / f.nproc);
  r.options.compute = compute_rates(config, r.options.fsdp.mixed_precision.param_dtype, on_host, f.gemm_gflops,
                                    f.memory_gbps, batch, r.kernel_efficiency);
}

}  // namespace

Resolved resolve(const PlanFlags& f, const std::optional<plan::ComputeRates>& rates) {
  Resolved r;
  const ModelSpec& spec = find_model(f.model);
  TrainConfig config = train_config_of(f, spec);
  r.nproc = f.nproc;
  r.tp = f.tp;
  r.rank = f.rank;
  if (f.tp > 1 && !spec.tensor_parallel)
    throw std::invalid_argument("--tp " + std::to_string(f.tp) + " needs ModelSpec::tensor_parallel, the model's split "
                                "into tensor-parallel layers, which --model " + f.model + "'s spec does not have");
  r.pp = f.pp;
  r.cp = f.cp;
  check_pipeline_schedule(config);  // as dtrain train refuses them
  check_pipeline_flags(f, spec);
  check_context_parallel_flags(f, spec);
  if (f.cp > 1 && f.nproc % (f.tp * f.pp * f.cp) != 0)
    throw std::invalid_argument("--cp " + std::to_string(f.cp) + (f.pp > 1 ? " x --pp " + std::to_string(f.pp) : "") +
                                (f.tp > 1 ? " x --tp " + std::to_string(f.tp) : "") + " does not divide --nproc " +
                                std::to_string(f.nproc) + " (the mesh is (dp, pp, cp, tp), dp = nproc / (pp x cp x tp))");
  if (f.nproc % (f.tp * f.pp) != 0) {
    if (f.pp == 1)
      throw std::invalid_argument("--tp " + std::to_string(f.tp) + " does not divide --nproc " +
                                  std::to_string(f.nproc) + " (the mesh is dp = nproc / tp by tp)");
    throw std::invalid_argument("--pp " + std::to_string(f.pp) + (f.tp > 1 ? " x --tp " + std::to_string(f.tp) : "") +
                                " does not divide --nproc " + std::to_string(f.nproc) + " (the mesh is dp = nproc / (" +
                                (f.tp > 1 ? "pp x tp) by pp by tp)" : "pp) by pp)"));
  }
  if (f.sequence_parallel && f.tp == 1)
    throw std::invalid_argument("--sequence-parallel splits tensor parallelism's activations along the sequence: it needs --tp N");
  if (f.sequence_parallel && f.seq_len % f.tp != 0)
    throw std::invalid_argument("--sequence-parallel with --tp " + std::to_string(f.tp) + " needs --seq-len divisible by " +
                                std::to_string(f.tp) + ", got " + std::to_string(f.seq_len) + " (as dtrain train)");
  // The engine runs over the dp x cp ranks; the pp, cp and tp ranks of one
  // dp group share its batch part.
  const int dp = f.nproc / (f.tp * f.pp * f.cp);
  r.dp = dp;
  const bool sequences = spec.token_sequences;
  r.global_batch = f.batch_size > 0 ? f.batch_size : (sequences ? 32 : 128);
  r.tokens_per_sample = sequences ? f.seq_len : 1;
  if (r.global_batch < dp)
    throw std::invalid_argument("--batch-size " + std::to_string(r.global_batch) +
                                " is the global batch and must be at least --nproc (" + std::to_string(dp) +
                                (f.tp * f.pp > 1 ? " dp groups" : "") + ": every rank needs a sample)");
  if (f.pp > 1 && r.global_batch % (static_cast<int64_t>(dp) * f.microbatches) != 0)
    throw std::invalid_argument("--batch-size " + std::to_string(r.global_batch) + " does not split into " +
                                std::to_string(dp) + " data-parallel part(s) x --microbatches " +
                                std::to_string(f.microbatches) + " equal microbatches (a multiple of " +
                                std::to_string(dp * f.microbatches) + ")");
  // DistributedSampler: the first B % N ranks get one sample more; plan the busiest.
  const int64_t per_rank = (r.global_batch + dp - 1) / dp;

  plan::set_strategy(r.options, f.strategy);
  r.options.world_size = dp * f.cp;
  if (f.rank >= f.nproc)
    throw std::invalid_argument("--rank " + std::to_string(f.rank) + " is outside --nproc " + std::to_string(f.nproc) +
                                " (ranks are 0.." + std::to_string(f.nproc - 1) + ")");
  r.options.rank = dp_coordinate(f, f.rank) * f.cp + cp_coordinate(f, f.rank);
  r.options.schedule = pp::schedule_from(f.schedule);
  r.options.gather_per_microbatch = f.pp_gather == "microbatch";
  if (strategy_info(f.strategy).sharding == Sharding::Hybrid) {
    if (f.hybrid_group_size == 0)
      throw std::invalid_argument("--strategy hsdp needs --hybrid-group-size G: ranks per sharding group, "
                                  "a divisor of --nproc");
    if (dp * f.cp % f.hybrid_group_size != 0)
      throw std::invalid_argument("--hybrid-group-size " + std::to_string(f.hybrid_group_size) +
                                  " must divide --nproc " + std::to_string(dp * f.cp) +
                                  (f.tp * f.pp > 1 ? " / (pp x tp)" : ""));
    r.options.fsdp.hybrid_group_size = f.hybrid_group_size;
  } else if (f.hybrid_group_size != 0) {
    throw std::invalid_argument("--hybrid-group-size applies to --strategy hsdp only, not " + f.strategy);
  }
  const bool bf16 = f.mixed_precision == "bf16";
  if (bf16 && strategy_info(f.strategy).engine != StrategyEngine::FSDP)
    throw std::invalid_argument("dtrain plan --mixed-precision bf16 models the sharded strategies only; --strategy " +
                                f.strategy + "'s bf16 compute copies are not in its model yet (plan it with "
                                "--mixed-precision none, or a sharded strategy)");
  // bf16 compute and all-gathers; gradients reduced in fp32 onto fp32 master shards.
  r.options.fsdp.mixed_precision.param_dtype = bf16 ? torch::kBFloat16 : torch::kFloat32;
  r.options.fsdp.mixed_precision.reduce_dtype = torch::kFloat32;
  r.options.fsdp.compression = parse_collective_compression(f.fsdp_compress);
  if (r.options.fsdp.compression != CollectiveCompression{}) {
    const StrategyInfo& row = strategy_info(f.strategy);
    if (!row.fsdp_compression)
      throw std::invalid_argument("--fsdp-compress needs --strategy " +
                                  strategy_list([](const StrategyInfo& s) { return s.fsdp_compression; }) + ", not " +
                                  f.strategy);
    if (row.sharding == Sharding::OptimizerOnly && r.options.fsdp.compression.grads != GradCompression::None)
      throw std::invalid_argument("--fsdp-compress grads=...: --strategy " + f.strategy +
                                  " all-reduces gradients; use grads=none with it");
  }
  if (f.fp8 != "off") {  // as dtrain train's check_float8
    r.options.float8.scaling = parse_float8_scaling(f.fp8);
    r.options.float8.min_width = f.fp8_min_width;
    if (f.fp8_min_width < 0) throw std::invalid_argument("--fp8-min-width must be >= 0");
    if (!spec.float8_layers)
      throw std::invalid_argument("--fp8 " + f.fp8 + ": --model " + f.model +
                                  "'s layers do not go through dtrain::linear (ModelSpec::float8_layers)");
    if (f.tp > 1) throw std::invalid_argument("--fp8 with --tp " + std::to_string(f.tp) + " is not available yet");
    r.options.fsdp.float8_all_gather = f.fp8_all_gather == "on";
  }
  if (f.activation_checkpointing == "on") {  // as dtrain train refuses what it does not run
    const std::string flag = "--activation-checkpointing on";
    require_fsdp_engine(f.strategy, kActivationCheckpointingNeedsFsdp);
    if (!spec.checkpointable_blocks)
      throw std::invalid_argument(flag + " recomputes the model's blocks (its FSDP units) in their backward: it needs a "
                                  "model whose spec declares them (ModelSpec::checkpointable_blocks); --model " + f.model +
                                  " is a single unit, the root, which keeps its activations");
    if (f.tp > 1 || f.pp > 1)
      throw std::invalid_argument(flag + " with --" + (f.tp > 1 ? "tp " + std::to_string(f.tp) : "pp " + std::to_string(f.pp)) +
                                  " is not available yet (dtrain train does not run it): leave one of them out");
    r.options.fsdp.activation_checkpointing = true;
  }
  r.options.fsdp.forward_prefetch = f.forward_prefetch;
  r.options.fsdp.backward_prefetch = f.backward_prefetch == "pre"    ? BackwardPrefetch::Pre
                                     : f.backward_prefetch == "post" ? BackwardPrefetch::Post
                                                                     : BackwardPrefetch::None;
  r.options.fsdp.max_inflight_all_gathers = f.max_inflight_all_gathers;
  r.options.fsdp.max_inflight_reductions = f.max_inflight_reductions;
  r.options.init_from = !f.init_from.empty();
  r.options.checkpoint_async = f.checkpoint_async;
  r.optimizer = f.optimizer.empty() ? (sequences ? "adamw" : "sgd") : f.optimizer;
  r.options.optimizer = plan::optimizer_from(r.optimizer, f.momentum);
  resolve_time(f, config, r, rates);

  const auto compute = r.options.fsdp.mixed_precision.param_dtype;
  config.batch_size = r.global_batch;
  if (spec.check) spec.check(config);  // the model's own flags, as dtrain train checks them
  if (f.pp > 1) {
    // Each pipeline rank's stage, or under interleaving its chunks: the
    // model's stages rank, rank + pp, ... of pp x V, merged.
    for (int stage = 0; stage < f.pp; ++stage) {
      if (f.virtual_stages == 1) {
        r.stages.push_back(spec.plan_stage_description(config, per_rank, f.microbatches, compute, stage));
        continue;
      }
      std::vector<plan::ModelSpec> chunks;
      for (int k = 0; k < f.virtual_stages; ++k)
        chunks.push_back(spec.plan_stage_description(config, per_rank, f.microbatches, compute, stage + k * f.pp));
      r.stages.push_back(plan::interleave_stages(std::move(chunks), stage, f.pp));
    }
    r.model = r.stages[static_cast<size_t>(pp_coordinate(f, f.rank))];
    r.activations = "described by the model's spec";
    return r;
  }
  // The model's spec describes it, or the model is measured (train::plan_model).
  train::PlannedModel planned = train::plan_model(config, per_rank, compute, /*probe=*/true, dp, f.probe);
  r.model = std::move(planned.model);
  r.activations = std::move(planned.activations);
  return r;
}

namespace {

// Which dimension of the mesh a collective runs over.
const char* dimension_of(const plan::Collective& c) {
  if (c.what.find("tensor parallel") != std::string::npos) return "tp";
  if (c.what.find("context parallel") != std::string::npos) return "cp";
  if (c.what.find("pipeline") != std::string::npos || c.what.find("end stages") != std::string::npos) return "pp";
  return "dp";
}

int64_t wire_bytes_over(const plan::Plan& p, const std::string& dimension) {
  int64_t sent = 0;
  for (const auto& c : p.collectives)
    if (dimension_of(c) == dimension) sent += c.wire_bytes;
  return sent;
}

// --pp: every stage's plan, at the planned rank's dp and tp coordinates.
std::vector<plan::Plan> stage_plans(const Resolved& r) {
  std::vector<plan::Plan> plans;
  for (const auto& stage : r.stages) plans.push_back(plan::make_plan(stage, r.options));
  return plans;
}

void print_pipeline(const Resolved& r, const plan::Plan& p) {
  const auto& stage = r.model.pipeline;
  const size_t chunks = std::max<size_t>(r.model.chunks.size(), 1);
  std::printf("\nPipeline: stage %d of %d, %d microbatch(es) of %lld window(s), %s%s: at most %d %s' "
              "activations alive at once; each microbatch's activation and its gradient are %s\n",
              stage.stage, stage.stages, stage.microbatches,
              static_cast<long long>(r.model.batch_per_rank / stage.microbatches),
              pp::schedule_name(r.options.schedule).c_str(),
              chunks > 1 ? (" over " + std::to_string(chunks) + " chunks per rank").c_str() : "",
              p.microbatches_in_flight, chunks > 1 ? "chunk-microbatches" : "microbatch(es)",
              human(stage.message_bytes).c_str());
  if (p.strategy != "ddp")
    std::printf("Units gathered %s (--pp-gather %s).\n",
                r.options.gather_per_microbatch ? "for each microbatch's forward and backward" : "once for the step",
                r.options.gather_per_microbatch ? "microbatch" : "step");
  std::printf("Every stage (at this rank's dp%s%s coordinate):\n", r.cp > 1 ? ", cp" : "", r.tp > 1 ? " and tp" : "");
  std::printf("  %-6s %-14s %12s %12s %10s %14s\n", "stage", "", "step peak", "start peak", "in flight", "pp sends/step");
  const auto plans = stage_plans(r);
  for (size_t s = 0; s < plans.size(); ++s) {
    const auto& description = r.stages[s].description;
    const auto blocks = description.find("(blocks ");
    const std::string which = blocks == std::string::npos ? "" : description.substr(blocks, description.find(')', blocks) - blocks + 1);
    std::printf("  %-6zu %-14s %12s %12s %10d %14s\n", s, which.c_str(), human(plans[s].peak.total()).c_str(),
                human(plans[s].construction.total()).c_str(), plans[s].microbatches_in_flight,
                human(wire_bytes_over(plans[s], "pp")).c_str());
  }
}

// --link: the engine's collectives on its link, the model's on its own.
double seconds_of(const Resolved& r, const plan::Collective& c) {
  return plan::collective_seconds(c, std::string(dimension_of(c)) == "dp" ? r.options.link : r.options.model_link);
}

// --link: every collective's time summed, none overlapped with compute.
double communication_seconds(const Resolved& r, const plan::Plan& p) {
  double seconds = 0;
  for (const auto& c : p.collectives) seconds += seconds_of(r, c);
  return seconds;
}

void print_time(const Resolved& r, const plan::StepTime& t) {
  if (!t.predicted()) return;
  const auto& rates = r.options.compute;
  std::printf("\nPredicted step time (rank %d): %.3f ms, %.0f %s/s over the %d ranks (Note [step time]: GEMMs at %.1f "
              "GFLOP/s, memory at %.1f GB/s per rank",
              r.rank, t.seconds * 1e3, static_cast<double>(tokens_per_step(r)) / t.seconds,
              r.tokens_per_sample > 1 ? "tokens" : "samples", r.nproc, rates.flops_per_second / 1e9,
              rates.memory_bytes_per_second / 1e9);
  if (r.kernel_efficiency != 1)
    std::printf("; the probes' rates x %.2f, as fast as the model's own forward and backward ran", r.kernel_efficiency);
  std::printf(")\n");
  std::printf("  compute %.3f ms, communication %.3f ms of which exposed %.3f ms", t.compute_seconds * 1e3,
              t.communication_seconds * 1e3, t.exposed_communication_seconds * 1e3);
  if (r.pp > 1) std::printf(", pipeline bubble %.3f ms", t.bubble_seconds * 1e3);
  std::printf("\n");
}

nlohmann::json to_json(const plan::StepTime& t) {
  if (!t.predicted()) return nullptr;
  return {{"seconds", t.seconds},
          {"compute_seconds", t.compute_seconds},
          {"communication_seconds", t.communication_seconds},
          {"exposed_communication_seconds", t.exposed_communication_seconds},
          {"bubble_seconds", t.bubble_seconds}};
}

void print(const Resolved& r, const plan::Plan& p) {
  const auto& model = r.model;
  std::printf("dtrain plan: %s\n", model.description.c_str());
  if (!r.activations.empty()) std::printf("  activations %s\n", r.activations.c_str());
  std::printf("  %.2fM parameters in %zu unit(s)%s\n", model.parameter_count() / 1e6, model.units.size(),
              model.units.size() == 1 ? " (the whole model is the root unit)"
              : r.pp > 1              ? " (the stage's root, one per block, and a tied embedding's own on the end stages)"
                                      : " (the root and one per block)");
  const bool ddp = p.strategy == "ddp";
  std::printf("  strategy %s, %d rank(s)", p.strategy.c_str(), r.nproc);
  if (r.cp > 1 && r.pp > 1)
    std::printf(", mesh (dp=%d, pp=%d, cp=%d, tp=%d): %s over dp x cp", r.dp, r.pp, r.cp, r.tp, p.strategy.c_str());
  else if (r.cp > 1)
    std::printf(", mesh (dp=%d, cp=%d, tp=%d): %s over dp x cp", r.dp, r.cp, r.tp, p.strategy.c_str());
  else if (r.pp > 1)
    std::printf(", mesh (dp=%d, pp=%d, tp=%d): %s over dp", p.world_size, r.pp, r.tp, p.strategy.c_str());
  else if (r.tp > 1)
    std::printf(", mesh (dp=%d, tp=%d): %s over dp", p.world_size, r.tp, p.strategy.c_str());
  if (!ddp) std::printf(", shard group %d", p.shard_group_size);
  std::printf(", batch %lld per rank (global %lld), %s, %s%s\n", static_cast<long long>(model.batch_per_rank),
              static_cast<long long>(r.global_batch),
              r.options.fsdp.mixed_precision.param_dtype == torch::kBFloat16 ? "bf16 compute" : "fp32", r.optimizer.c_str(),
              r.options.fsdp.activation_checkpointing ? ", activation checkpointing (blocks recomputed in backward)" : "");
  if (r.options.float8.scaling != Float8Scaling::Off)
    std::printf("fp8 %s linear layers (K N / (K + N) >= %lld)%s\n", float8_scaling_name(r.options.float8.scaling).c_str(),
                static_cast<long long>(r.options.float8.min_width),
                r.options.float8.scaling == Float8Scaling::Tensorwise && r.options.fsdp.float8_all_gather && !ddp
                    ? ", their weights all-gathered as fp8 after the first step; activations as without fp8"
                    : ", activations as without fp8");

  std::printf("\nPeak memory of rank %d: %s (the larger of the start's and a step's)\n", r.rank,
              human(p.overall_peak_bytes()).c_str());
  std::printf("  start (construction%s): %s, at %s\n", r.options.init_from ? ", --init-from" : "",
              human(p.construction.total()).c_str(), p.construction_moment.c_str());
  std::printf("  training step: %s, at %s\n", human(p.peak.total()).c_str(), p.peak_moment.c_str());
  auto row = [](const char* what, int64_t bytes, const char* note) {
    std::printf("  %-22s %12s  %s\n", what, human(bytes).c_str(), note);
  };
  row("parameters", p.peak.parameters, ddp ? "full replica" : p.shard_group_size > 1 ? "this rank's shards" : "unsharded");
  row("gathered parameters", p.peak.gathered_parameters, "full units all-gathered or in flight");
  row("gradients", p.peak.gradients, "");
  row("reduction buffers", p.peak.reduction_buffers, ddp ? "DDP buckets" : "full-size gradients being reduced");
  row("optimizer state", p.peak.optimizer_state, "");
  row("activations", p.peak.activations, "saved for backward, workspace, batch, logits (estimate)");
  if (r.options.checkpoint_async)
    row("checkpoint staging", p.peak.checkpoint_staging, "--checkpoint-async: this rank's checkpoint in host memory");
  if (r.pp > 1)
    std::printf("Activations after a forward, at the most microbatches in flight (estimate): %s.\n",
                human(p.forward_activation_bytes).c_str());
  else
    std::printf("Activations at the end of forward (estimate, batch %lld per rank): %s.\n",
                static_cast<long long>(model.batch_per_rank), human(p.forward_activation_bytes).c_str());
  std::printf("Between steps: %s.", human(p.between_steps.total()).c_str());
  if (!ddp)
    std::printf(" Largest unit gathered: %s; at most %d unit(s) gathered at once.",
                human(p.largest_unit_gathered_bytes).c_str(), p.max_units_gathered);
  std::printf("\n");
  if (r.pp > 1) print_pipeline(r, p);

  std::printf("\nCommunication per step (rank %d): %s handed to collectives, about %s sent (ring algorithms)\n",
              r.rank, human(p.payload_bytes_per_step).c_str(), human(p.wire_bytes_per_step).c_str());
  if (r.options.fsdp.compression != CollectiveCompression{})
    std::printf("  compressed (--fsdp-compress %s): the byte counts below are the compressed records; the memory "
                "above does not count the records' buffers\n",
                to_string(r.options.fsdp.compression).c_str());
  if (r.tp > 1 || r.pp > 1 || r.cp > 1) {
    std::printf("  by dimension: dp%s (groups of %d) sends %s", r.cp > 1 ? " x cp" : "", p.world_size,
                human(wire_bytes_over(p, "dp")).c_str());
    if (r.cp > 1) std::printf(", cp (rings of %d) %s", r.cp, human(wire_bytes_over(p, "cp")).c_str());
    if (r.pp > 1) std::printf(", pp (%d stages) %s", r.pp, human(wire_bytes_over(p, "pp")).c_str());
    if (r.tp > 1) std::printf(", tp (groups of %d) %s", r.tp, human(wire_bytes_over(p, "tp")).c_str());
    std::printf("\n");
  }
  for (const auto& c : p.collectives) {
    std::printf("  %-15s %-33s group %-3d %4lld calls %12s  sent %12s", c.op.c_str(), c.what.c_str(), c.group_size,
                static_cast<long long>(c.calls), human(c.payload_bytes).c_str(), human(c.wire_bytes).c_str());
    if (r.timed()) std::printf("  %9.3f ms", seconds_of(r, c) * 1e3);
    std::printf("\n");
  }
  if (r.timed())
    std::printf("Communication time per step on --link (%.2f us per hop, %.3f GB/s; alpha-beta, ring algorithms, "
                "nothing overlapped): %.3f ms\n",
                r.options.link.latency_seconds * 1e6, r.options.link.bytes_per_second / 1e9, communication_seconds(r, p) * 1e3);
  print_time(r, step_time(r, p));
}

nlohmann::json to_json(const Resolved& r, const plan::Plan& p) {
  nlohmann::json units = nlohmann::json::array();
  for (const auto& u : p.units)
    units.push_back({{"name", u.name}, {"numel", u.numel}, {"padded_numel", u.padded_numel},
                     {"shard_numel", u.shard_numel}, {"gathered_bytes", u.gathered_bytes}});
  nlohmann::json collectives = nlohmann::json::array();
  for (const auto& c : p.collectives) {
    collectives.push_back({{"op", c.op}, {"what", c.what}, {"group_size", c.group_size}, {"calls", c.calls},
                           {"payload_bytes", c.payload_bytes}, {"wire_bytes", c.wire_bytes}});
    if (r.timed()) collectives.back()["seconds"] = seconds_of(r, c);
  }
  nlohmann::json pipeline = nullptr;
  if (r.pp > 1) {
    nlohmann::json stages = nlohmann::json::array();
    const auto plans = stage_plans(r);
    for (size_t s = 0; s < plans.size(); ++s)
      stages.push_back({{"stage", s}, {"step_peak_bytes", plans[s].peak.total()},
                        {"construction_peak_bytes", plans[s].construction.total()},
                        {"peak_bytes", plans[s].overall_peak_bytes()}, {"peak_moment", plans[s].peak_moment},
                        {"microbatches_in_flight", plans[s].microbatches_in_flight},
                        {"pp_wire_bytes_per_step", wire_bytes_over(plans[s], "pp")}});
    const auto& stage = r.model.pipeline;
    pipeline = {{"stage", stage.stage}, {"stages", stage.stages}, {"microbatches", stage.microbatches},
                {"schedule", pp::schedule_name(r.options.schedule)},
                {"virtual_stages", std::max<size_t>(r.model.chunks.size(), 1)},
                {"gather", r.options.gather_per_microbatch ? "microbatch" : "step"},
                {"microbatches_in_flight", p.microbatches_in_flight}, {"message_bytes", stage.message_bytes},
                {"per_stage", stages}};
  }
  return {{"model", r.model.description},
          {"activations_from", r.activations},
          {"parameters", r.model.parameter_count()},
          {"strategy", p.strategy},
          {"nproc", r.nproc},
          {"mesh", {{"dp", r.dp}, {"pp", r.pp}, {"cp", r.cp}, {"tp", r.tp}}},
          {"pipeline", pipeline},
          {"shard_group_size", p.shard_group_size},
          {"rank", r.rank},
          {"batch_size", r.global_batch},
          {"batch_per_rank", r.model.batch_per_rank},
          {"mixed_precision", r.options.fsdp.mixed_precision.param_dtype == torch::kBFloat16 ? "bf16" : "none"},
          {"optimizer", r.optimizer},
          {"fsdp_compress", to_string(r.options.fsdp.compression)},
          {"fp8", float8_scaling_name(r.options.float8.scaling)},
          {"fp8_all_gather", r.options.float8.scaling == Float8Scaling::Tensorwise && r.options.fsdp.float8_all_gather},
          {"activation_checkpointing", r.options.fsdp.activation_checkpointing},
          {"peak_bytes", p.overall_peak_bytes()},
          {"step_peak_bytes", p.peak.total()},
          {"peak", to_json(p.peak)},
          {"peak_moment", p.peak_moment},
          {"construction_peak_bytes", p.construction.total()},
          {"construction", to_json(p.construction)},
          {"construction_moment", p.construction_moment},
          {"between_steps", to_json(p.between_steps)},
          {"forward_activation_bytes", p.forward_activation_bytes},
          {"max_units_gathered", p.max_units_gathered},
          {"largest_unit_gathered_bytes", p.largest_unit_gathered_bytes},
          {"units", units},
          {"collectives", collectives},
          {"payload_bytes_per_step", p.payload_bytes_per_step},
          {"wire_bytes_per_step", p.wire_bytes_per_step},
          {"link", r.timed() ? nlohmann::json{{"latency_seconds", r.options.link.latency_seconds},
                                           {"bytes_per_second", r.options.link.bytes_per_second}}
                          : nlohmann::json()},
          {"communication_seconds", r.timed() ? nlohmann::json(communication_seconds(r, p)) : nlohmann::json()},
          {"time", to_json(step_time(r, p))},
          {"rates", r.timed() ? nlohmann::json{{"gemm_flops_per_second", r.options.compute.flops_per_second},
                                            {"memory_bytes_per_second", r.options.compute.memory_bytes_per_second},
                                            {"communication_share", r.options.compute.communication_share},
                                            {"kernel_efficiency", r.kernel_efficiency}}
                           : nlohmann::json()},
          {"tokens_per_step", tokens_per_step(r)}};
}

}  // namespace

plan::StepTime step_time(const Resolved& r, const plan::Plan& p) {
  if (r.pp == 1) return p.time;
  const auto times = plan::pipeline_step_times(r.stages, r.options);
  return times[static_cast<size_t>(r.model.pipeline.stage)];
}

int64_t tokens_per_step(const Resolved& r) { return r.global_batch * r.tokens_per_sample; }

CLI::App* add_plan_subcommand(CLI::App& app, PlanFlags& f) {
  auto* cmd = app.add_subcommand("plan", "Predict per-rank peak memory and per-step communication before running");
  cmd->add_option("--model", f.model, "A registered model (as dtrain train --model): a model with no plan description "
                                      "of its own (ModelSpec::plan_description) is planned from itself, its activations "
                                      "measured by a probe step")
      ->check(kRegisteredModel)->capture_default_str();
  add_model_options(*cmd, f.model_options);
  cmd->add_option("--mlp-hidden", f.mlp_hidden, "MLP hidden widths, comma-separated")
      ->delimiter(',')->check(at_least(1))->capture_default_str();
  cmd->add_option("--gpt-layers", f.gpt_layers, "GPT transformer blocks")->check(at_least(1))->capture_default_str();
  cmd->add_option("--gpt-dim", f.gpt_dim, "GPT embedding width")->check(at_least(1))->capture_default_str();
  cmd->add_option("--gpt-heads", f.gpt_heads, "GPT attention heads (must divide --gpt-dim)")->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--seq-len", f.seq_len, "GPT context length (tokens per sample)")->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--vocab-size", f.vocab_size, "GPT vocabulary (as dtrain train --vocab-size)")->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--kv-heads", f.kv_heads, "Key/value heads, dividing --gpt-heads (as dtrain train --kv-heads)")
      ->check(at_least(0));
  cmd->add_option("--ffn-dim", f.ffn_dim, "The SwiGLU MLP's width (as dtrain train --ffn-dim)")->check(at_least(0));
  cmd->add_flag("--tie-embeddings", f.tie_embeddings, "The output head is the token embedding (as dtrain train)");
  std::vector<std::string> planned;
  for (const auto& row : strategy_table())
    if (row.planned) planned.emplace_back(row.name);
  cmd->add_option("--strategy", f.strategy, strategy_list([](const StrategyInfo& r) { return r.planned; }))
      ->check(CLI::IsMember(planned))->capture_default_str();
  cmd->add_option("--nproc", f.nproc, "Ranks of the run (required)")->required()->check(at_least(1));
  cmd->add_option("--hybrid-group-size", f.hybrid_group_size, "hsdp: ranks per sharding group (divides --nproc)")
      ->check(at_least(1));
  cmd->add_option("--batch-size", f.batch_size, "Global batch: samples per step over all ranks (default: gpt 32, else 128)")
      ->check(at_least(1));
  cmd->add_option("--mixed-precision", f.mixed_precision, "none | bf16 (bf16 compute and all-gathers, fp32 reduction and master shards)")
      ->check(CLI::IsMember({"none", "bf16"}))->capture_default_str();
  cmd->add_option("--fsdp-compress", f.fsdp_compress,
                  "Sharded strategies: compressed collectives as dtrain train takes them, e.g. params=int8,grads=bf16")
      ->capture_default_str();
  cmd->add_option("--fp8", f.fp8,
                  "off | tensorwise | rowwise, as dtrain train --fp8: with tensorwise and a sharded strategy the fp8 "
                  "layers' weights are all-gathered as fp8 (a byte per element; the steps after the first)")
      ->check(CLI::IsMember({"off", "tensorwise", "rowwise"}))->capture_default_str();
  cmd->add_option("--fp8-min-width", f.fp8_min_width, "As dtrain train --fp8-min-width")->capture_default_str();
  cmd->add_option("--fp8-all-gather", f.fp8_all_gather, "on | off, as dtrain train --fp8-all-gather")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  cmd->add_option("--activation-checkpointing", f.activation_checkpointing,
                  "Sharded strategies with --model gpt: on (each block keeps only its input from forward to backward "
                  "and is recomputed in its backward, as dtrain train --activation-checkpointing on) | off")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  cmd->add_option("--optimizer", f.optimizer, "adamw | sgd (default: gpt adamw, else sgd)")
      ->check(CLI::IsMember({"adamw", "sgd"}));
  cmd->add_option("--momentum", f.momentum, "SGD momentum (0: no momentum buffer)")->capture_default_str()
      ->check(CLI::Range(0.0, 0.999999));
  cmd->add_option("--forward-prefetch", f.forward_prefetch, "FSDP forward prefetch: true | false")->capture_default_str();
  cmd->add_option("--backward-prefetch", f.backward_prefetch, "FSDP backward prefetch: pre | post | none")
      ->check(CLI::IsMember({"pre", "post", "none"}))->capture_default_str();
  cmd->add_option("--init-from", f.init_from,
                  "The run's --init-from FILE.safetensors: the start then reads it (DDP: all of it next to the replica; "
                  "sharded: only this rank's pieces)");
  cmd->add_flag("--checkpoint-async", f.checkpoint_async,
                "The run's --checkpoint-async: from the first save on, each rank also holds its checkpoint pieces in "
                "host memory (the staging buffer)");
  cmd->add_option("--max-inflight-all-gathers", f.max_inflight_all_gathers, "FSDP all-gathers issued ahead")
      ->check(at_least(1))->capture_default_str();
  cmd->add_option("--max-inflight-reductions", f.max_inflight_reductions,
                  "FSDP gradient reduce-scatters outstanding (each holds a full-size gradient buffer)")
      ->check(at_least(1))->capture_default_str();
  cmd->add_option("--rank", f.rank, "The rank to plan (rank 0 holds the most; the last ranks hold the padding)")
      ->check(at_least(0))->capture_default_str();
  cmd->add_option("--tp", f.tp, "Tensor parallelism: the (dp, tp) mesh as dtrain train --tp builds it; --strategy runs over dp")
      ->check(at_least(1))->capture_default_str();
  cmd->add_flag("--sequence-parallel", f.sequence_parallel, "With --tp: activations outside attention and the MLP split along the sequence");
  cmd->add_option("--cp", f.cp, "Context parallelism: every sequence split over N ranks, the (dp, pp, cp, tp) mesh "
                  "as dtrain train --cp builds it; --strategy runs over dp x cp")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--pp", f.pp, "Pipeline parallelism: the (dp, pp, tp) mesh as dtrain train --pp builds it; "
                  "--rank picks the stage, and every stage's peak is listed")
      ->check(at_least(1))->capture_default_str();
  cmd->add_option("--microbatches", f.microbatches, "With --pp: microbatches per batch part")
      ->check(at_least(1))->capture_default_str();
  cmd->add_option("--schedule", f.schedule, "With --pp: 1f1b | gpipe | interleaved")
      ->check(CLI::IsMember({"1f1b", "gpipe", "interleaved"}))->capture_default_str();
  cmd->add_option("--virtual-stages", f.virtual_stages,
                  "With --schedule interleaved: model chunks per pipeline rank (as dtrain train)")
      ->check(at_least(1))->capture_default_str();
  cmd->add_option("--pp-gather", f.pp_gather, "With --pp and a sharded strategy: step | microbatch (as dtrain train)")
      ->check(CLI::IsMember({"step", "microbatch"}))->capture_default_str();
  cmd->add_option("--link", f.link,
                  "The links to time the step on: LATENCY_US,GB_PER_S (one alpha-beta link), "
                  "intra=LATENCY_US,GB_PER_S,inter=LATENCY_US,GB_PER_S (within and across hosts), or the JSON file "
                  "`dtrain bench collectives --json FILE` wrote; prints each collective's time and the step's "
                  "predicted time (Note [step time])");
  cmd->add_option("--ranks-per-host", f.ranks_per_host,
                  "With --link: ranks per host, in rank order (default: all on one); a group across hosts uses inter")
      ->check(at_least(1));
  cmd->add_option("--gemm-gflops", f.gemm_gflops,
                  "With --link: one rank's matrix-product rate (default: the cached GEMM probe, shared by the ranks "
                  "on this machine's cores)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--memory-gbps", f.memory_gbps,
                  "With --link: one rank's memory bandwidth in GB/s (default: a copy probe, shared likewise)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--json", f.json, "Print the plan as JSON");
  cmd->add_option("--explain", f.explain,
                  "With --link: write the predicted step's timeline to PATH as a trace (every stage's ranks under "
                  "--pp); `dtrain trace summary PATH` reads it as it reads dtrain train --trace's");
  cmd->add_flag("--search", f.search,
                "Rank every layout dtrain train accepts on --nproc ranks (mesh, strategy, microbatches and schedule, "
                "activation checkpointing, prefetch) that fits --device-memory, by predicted tokens/s "
                "(needs --link); the layout flags given are the search's to choose");
  cmd->add_option("--top", f.top, "With --search: the layouts listed (0: all that fit)")->check(at_least(0))
      ->capture_default_str();
  cmd->add_option("--device-memory", f.device_memory,
                  "With --search: one rank's memory, e.g. 80GiB (default: this machine's memory over the ranks per host)");
  cmd->add_flag("--probe", f.probe,
                "Measure the activations with one forward and backward of the model at two small batches, even "
                "where its spec describes them (a check of the description; fp32, without --pp)");
  return cmd;
}

// --explain: the predicted step of the planned rank (or of every pipeline
// rank at its dp, cp and tp coordinates) in the trace format dtrain train
// --trace writes: a "train" thread with compute, wait and step spans, and a
// "comm" thread with the collectives.
void write_explained_trace(const PlanFlags& f, const Resolved& r, const plan::Plan& p) {
  std::vector<std::pair<int, plan::StepTime>> ranks;
  if (r.pp == 1) {
    ranks.emplace_back(f.rank, p.time);
  } else {
    auto times = plan::pipeline_step_times(r.stages, r.options);
    const int block = r.pp * r.cp * r.tp, stride = r.cp * r.tp;
    for (int s = 0; s < r.pp; ++s)
      ranks.emplace_back(f.rank / block * block + s * stride + f.rank % stride, std::move(times[static_cast<size_t>(s)]));
  }
  nlohmann::json events = nlohmann::json::array();
  for (const auto& [rank, time] : ranks) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", 0}, {"args", {{"name", "train"}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", 1}, {"args", {{"name", "comm"}}}});
    for (const auto& span : time.spans) {
      nlohmann::json event{{"ph", "X"},  {"pid", rank},
                           {"tid", span.link ? 1 : 0},       {"cat", span.category},
                           {"name", span.name},              {"ts", span.start_seconds * 1e6},
                           {"dur", span.seconds * 1e6}};
      if (span.bytes > 0) event["args"] = {{"bytes", span.bytes}};
      events.push_back(std::move(event));
    }
  }
  if (!write_json_file(f.explain, nlohmann::json{{"traceEvents", events}, {"predicted", true}}))
    throw std::runtime_error("cannot write --explain " + f.explain);
}

int plan_main(const PlanFlags& flags) {
  if (flags.search) return print_search(flags);
  if (!flags.explain.empty() && flags.link.empty())
    throw std::invalid_argument("--explain writes the predicted step's timeline: give --link too (`dtrain bench "
                                "collectives --json FILE` measures it)");
  auto resolved = resolve(flags);
  resolved.options.explain = !flags.explain.empty();
  const auto p = plan::make_plan(resolved.model, resolved.options);
  if (flags.json) std::cout << to_json(resolved, p).dump(2) << std::endl;
  else print(resolved, p);
  if (!flags.explain.empty()) {
    write_explained_trace(flags, resolved, p);
    if (!flags.json)
      std::printf("Predicted timeline written to %s (`dtrain trace summary %s` reads it)\n", flags.explain.c_str(),
                  flags.explain.c_str());
  }
  return 0;
}

}  // namespace dtrain::cli
