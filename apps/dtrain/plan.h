// `dtrain plan`: per-rank peak memory and per-step communication of a
// training run, predicted before running it (include/dtrain/plan.h does
// the arithmetic; this file is flags and printing).
//
//   dtrain plan --model gpt --gpt-layers 14 --gpt-dim 768 --gpt-heads 12 --seq-len 64
//               --strategy fsdp --nproc 4 --batch-size 8 [--tp 2] [--pp 2 --microbatches 4] [--json]
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtrain::cli {

struct PlanFlags {
  std::string model = "mlp";  // a registered model (as dtrain train --model)
  std::map<std::string, std::string> model_options;  // --model-option KEY=VALUE
  std::vector<int64_t> mlp_hidden{256, 256};
  int64_t gpt_layers = 4;
  int64_t gpt_dim = 128;
  int64_t gpt_heads = 4;
  int64_t seq_len = 128;
  int64_t vocab_size = 256;
  int64_t kv_heads = 0;         // llama (as dtrain train): 0 = --gpt-heads
  int64_t ffn_dim = 0;          // llama: 0 = the default width
  bool tie_embeddings = false;  // llama
  std::string strategy = "fsdp";  // ddp | zero1 | zero2 | fsdp | hsdp
  int nproc = 0;                  // required
  int hybrid_group_size = 0;      // hsdp: required
  int64_t batch_size = 0;         // global; 0: gpt 32, else 128 (as dtrain train)
  std::string mixed_precision = "none";  // none | bf16
  std::string fsdp_compress = "none";    // as dtrain train --fsdp-compress
  std::string fp8 = "off";               // as dtrain train --fp8, --fp8-min-width, --fp8-all-gather
  int64_t fp8_min_width = 1024;
  std::string fp8_all_gather = "on";
  std::string activation_checkpointing = "off";  // on | off (as dtrain train)
  std::string optimizer;          // adamw | sgd; "": gpt adamw, else sgd (as dtrain train)
  double momentum = 0.9;
  bool forward_prefetch = true;
  std::string backward_prefetch = "pre";  // pre | post | none
  int max_inflight_all_gathers = 2;
  int max_inflight_reductions = 1;
  std::string init_from;  // --init-from: the weights come from this safetensors file (only its presence matters)
  bool checkpoint_async = false;  // dtrain train --checkpoint-async: its staging buffer
  int rank = 0;
  int tp = 1;                     // dtrain train --tp: the (dp, tp) mesh, dp = nproc / tp
  bool sequence_parallel = false;
  int pp = 1;                     // dtrain train --pp: the (dp, pp, tp) mesh, dp = nproc / (pp x tp)
  int cp = 1;                     // dtrain train --cp: the (dp, pp, cp, tp) mesh, dp = nproc / (pp x cp x tp)
  int microbatches = 1;
  std::string schedule = "1f1b";  // 1f1b | gpipe | interleaved
  int virtual_stages = 1;         // interleaved: model chunks per pipeline rank
  std::string pp_gather = "step";  // step | microbatch (sharded strategies)
  // --link: the links a step's collectives are timed on (plan_time.h,
  // parse_links; `dtrain bench collectives` fits them). With it the plan
  // predicts the step's time.
  std::string link;
  int ranks_per_host = 0;    // 0: every rank on one host
  double gemm_gflops = 0;    // 0: the cached GEMM probe (train/peak_flops.h)
  double memory_gbps = 0;    // 0: a copy probe (train/memory_bandwidth.h)
  bool json = false;
  // --explain PATH: the predicted step's timeline as a trace (every stage's
  // ranks under --pp), which `dtrain trace summary` reads as a measured one.
  std::string explain;
  // --search: every layout dtrain train accepts on --nproc ranks, ranked by
  // predicted tokens/s (plan_search.h).
  bool search = false;
  int top = 10;                  // rows listed (0: all)
  std::string device_memory;     // a rank's memory limit, e.g. 80GiB ("": this machine's RAM / ranks per host)
  bool probe = false;  // measure the activations even where the model's spec describes them
};

// The model's flags, which dtrain plan and dtrain train (TrainConfig) name
// alike, from one to the other.
template <typename From, typename To>
void copy_model_flags(const From& from, To& to) {
  to.model = from.model;
  to.model_options = from.model_options;
  to.mlp_hidden = from.mlp_hidden;
  to.gpt_layers = from.gpt_layers;
  to.gpt_dim = from.gpt_dim;
  to.gpt_heads = from.gpt_heads;
  to.seq_len = from.seq_len;
  to.vocab_size = from.vocab_size;
  to.kv_heads = from.kv_heads;
  to.ffn_dim = from.ffn_dim;
  to.tie_embeddings = from.tie_embeddings;
}

CLI::App* add_plan_subcommand(CLI::App& app, PlanFlags& flags);

// After parsing. Throws std::invalid_argument for inconsistent flags (main
// turns it into exit code 2).
int plan_main(const PlanFlags& flags);

}  // namespace dtrain::cli
