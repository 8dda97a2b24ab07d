#include "train/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <ostream>

namespace dtrain::train {
namespace {

// Clears from the cursor to the end of the line (ANSI), so a shorter line
// leaves no tail of the previous one.
constexpr const char* kClearToEnd = "\x1b[K";

std::string format_line(const ProgressSnapshot& s) {
  char head[160];
  std::snprintf(head, sizeof(head), "step %lld/%lld  loss %.4f  %.0f %s  ETA %s", static_cast<long long>(s.step),
                static_cast<long long>(s.total), s.loss, s.rate, s.rate_unit.c_str(),
                format_duration(s.eta_s).c_str());
  std::string line = head;
  if (s.mfu > 0) {
    char mfu[32];
    std::snprintf(mfu, sizeof(mfu), "  MFU %.1f%%", 100 * s.mfu);
    line += mfu;
  }
  if (!s.peak_bytes_per_rank.empty()) {
    line += "  peak mem";
    for (size_t rank = 0; rank < s.peak_bytes_per_rank.size(); ++rank)
      line += (rank == 0 ? " " : " | ") + format_bytes(s.peak_bytes_per_rank[rank]);
  }
  return line;
}

}  // namespace

ProgressLine::ProgressLine(std::ostream& out, bool live, int64_t log_every)
    : out_(out), live_(live), log_every_(log_every < 1 ? 1 : log_every) {}

ProgressLine::~ProgressLine() { finish(); }

bool ProgressLine::stdout_is_terminal() { return isatty(STDOUT_FILENO) == 1; }

void ProgressLine::update(const ProgressSnapshot& snapshot) {
  if (live_) {
    current_ = format_line(snapshot);
    out_ << '\r' << current_ << kClearToEnd << std::flush;
    return;
  }
  if (snapshot.step % log_every_ == 0 || snapshot.step == snapshot.total) out_ << format_line(snapshot) << std::endl;
}

void ProgressLine::message(const std::string& text) {
  if (live_ && !current_.empty()) {
    out_ << '\r' << text << kClearToEnd << '\n' << current_ << std::flush;
    return;
  }
  out_ << text << std::endl;
}

void ProgressLine::finish() {
  if (live_ && !current_.empty()) out_ << std::endl;
  current_.clear();
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::fabs(value) >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  if (unit == 0)
    std::snprintf(text, sizeof(text), "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(text, sizeof(text), value < 10 ? "%.2f %s" : value < 100 ? "%.1f %s" : "%.0f %s", value, units[unit]);
  return text;
}

std::string format_count(int64_t n) {
  const std::string digits = std::to_string(n);
  std::string text;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0 && digits[i - 1] != '-') text += ',';
    text += digits[i];
  }
  return text;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto total = static_cast<long long>(std::llround(seconds));
  char text[32];
  if (total < 60)
    std::snprintf(text, sizeof(text), "%llds", total);
  else if (total < 3600)
    std::snprintf(text, sizeof(text), "%lldm%02llds", total / 60, total % 60);
  else
    std::snprintf(text, sizeof(text), "%lldh%02lldm", total / 3600, (total % 3600) / 60);
  return text;
}

}  // namespace dtrain::train
