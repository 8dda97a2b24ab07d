// What every timing loop needs (the trainer, the parameter server's loop and
// the benchmarks): seconds since a start, the median of samples, a list in
// one line. Header-only and LibTorch-free.
#pragma once

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

namespace dtrain {

using SteadyClock = std::chrono::steady_clock;

inline double seconds_since(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// 0 for no samples; the mean of the middle two for an even count.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// "a, b, c" (or with another separator).
inline std::string join(const std::vector<std::string>& values, const std::string& separator = ", ") {
  std::string text;
  for (const auto& value : values) text += (text.empty() ? "" : separator) + value;
  return text;
}

}  // namespace dtrain
