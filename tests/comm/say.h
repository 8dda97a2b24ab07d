// For the multi-rank test programs: print a line to stderr with one write(),
// so lines of concurrent ranks do not interleave.
#pragma once

#include <string>
#include <unistd.h>

inline void say(const std::string& line) {
  const std::string text = line + "\n";
  [[maybe_unused]] auto written = ::write(2, text.data(), text.size());
}
