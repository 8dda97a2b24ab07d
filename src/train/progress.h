// What rank 0 shows while training: one live line rewritten in place when
// stdout is a terminal, plain lines every log_every steps otherwise.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace dtrain::train {

struct ProgressSnapshot {
  int64_t step = 0;   // optimizer steps done, 1..total
  int64_t total = 0;
  double loss = 0;    // the global batch's mean loss at this step
  double rate = 0;    // samples or tokens per second over the recent steps
  std::string rate_unit;  // "samples/s" or "tokens/s"
  double eta_s = 0;
  std::vector<int64_t> peak_bytes_per_rank;
  double mfu = 0;  // model FLOPs utilisation over the recent steps; 0 = unknown (not shown)
};

class ProgressLine {
 public:
  // live: rewrite one line with \r (for a terminal). Plain mode prints a line
  // when step % log_every == 0 and at the last step.
  ProgressLine(std::ostream& out, bool live, int64_t log_every);
  ~ProgressLine();

  void update(const ProgressSnapshot& snapshot);
  // A line of its own (evaluation results, notes); the live line is redrawn below it.
  void message(const std::string& text);
  // Ends the live line so that later output starts on a fresh line.
  void finish();

  // True when stdout is a terminal.
  static bool stdout_is_terminal();

 private:
  std::ostream& out_;
  bool live_;
  int64_t log_every_;
  std::string current_;  // the live line on screen, "" when none
};

// "12.3 MiB", "1.02 GiB", "512 B".
std::string format_bytes(int64_t bytes);
// "60,000".
std::string format_count(int64_t n);
// "45s", "3m07s", "1h02m".
std::string format_duration(double seconds);

}  // namespace dtrain::train
