// `dtrain bench fp8`: one linear layer's forward and backward in bf16 and in
// fp8 (tensorwise, rowwise) over a grid of shapes, side by side in one run,
// with what Note [which layers run in fp8] (dtrain/float8.h) decides for
// each: the measurement behind --fp8-min-width (the GPU kit's fp8 phase).
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace dtrain::cli {

struct BenchFp8Options {
  std::string device = "cuda";  // cuda | cpu (the emulation: the dry run)
  int64_t tokens = 8192;        // M, the rows of the input
  std::string shapes = "1024x1024,1024x4096,2048x2048,2048x8192,4096x4096,4096x14336,8192x8192";  // KxN,...
  int repeats = 20;
  int64_t min_width = 1024;  // the rule's threshold, to say what it decides
  std::string json_path;
};

int bench_fp8_main(const BenchFp8Options& options);

// Declares `dtrain bench fp8` and its flags under `bench`.
CLI::App* add_bench_fp8_subcommand(CLI::App& bench, BenchFp8Options& options);

}  // namespace dtrain::cli
