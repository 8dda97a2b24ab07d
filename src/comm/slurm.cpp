#include "comm/slurm.h"

#include "comm/env.h"
#include "dtrain/comm.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace dtrain {
namespace {

// A list bigger than any cluster is a typo such as node[1-100000000].
constexpr size_t kMaxHosts = 1 << 20;

[[noreturn]] void malformed(const std::string& list, const std::string& why) {
  throw CommError("Slurm host list '" + list + "': " + why);
}

bool all_digits(const std::string& text) {
  if (text.empty()) return false;
  for (const char c : text)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// The names of one bracket group's body, "01-03,07" -> 01 02 03 07; a range
// is padded to its first bound's width, as Slurm writes "node[08-10]".
std::vector<std::string> expand_ranges(const std::string& body, const std::string& list) {
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= body.size()) {
    const size_t comma = std::min(body.find(',', start), body.size());
    const std::string part = body.substr(start, comma - start);
    const size_t dash = part.find('-');
    const std::string low = part.substr(0, dash);
    const std::string high = dash == std::string::npos ? low : part.substr(dash + 1);
    if (!all_digits(low) || !all_digits(high) || low.size() > 9 || high.size() > 9)
      malformed(list, "'[" + body + "]' must hold numbers and ranges such as 01-03,07");
    const long first = std::atol(low.c_str()), last = std::atol(high.c_str());
    if (last < first) malformed(list, "range " + part + " runs backwards");
    if (names.size() + static_cast<size_t>(last - first) >= kMaxHosts) malformed(list, "too many hosts");
    for (long n = first; n <= last; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < low.size()) digits.insert(0, low.size() - digits.size(), '0');
      names.push_back(digits);
    }
    start = comma + 1;
  }
  return names;
}

// One host expression without top-level commas, e.g. "rack[1-2]-n[01-02]":
// every combination of its bracket groups, the first group varying slowest.
void expand_item(const std::string& item, const std::string& list, std::vector<std::string>& out) {
  std::vector<std::string> names{""};
  size_t at = 0;
  while (at < item.size()) {
    const size_t open = item.find('[', at);
    const std::string text = item.substr(at, open == std::string::npos ? std::string::npos : open - at);
    if (text.find(']') != std::string::npos) malformed(list, "']' without '['");
    for (auto& name : names) name += text;
    if (open == std::string::npos) break;
    const size_t close = item.find(']', open);
    if (close == std::string::npos) malformed(list, "'[' without ']'");
    const auto numbers = expand_ranges(item.substr(open + 1, close - open - 1), list);
    if (names.size() * numbers.size() > kMaxHosts) malformed(list, "too many hosts");
    std::vector<std::string> longer;
    for (const auto& name : names)
      for (const auto& number : numbers) longer.push_back(name + number);
    names.swap(longer);
    at = close + 1;
  }
  if (names.size() == 1 && names[0].empty()) malformed(list, "empty host name");
  out.insert(out.end(), names.begin(), names.end());
}

int slurm_int(const EnvLookup& env, const char* name, int min, int max) {
  const auto text = env(name);
  if (!text || !all_digits(*text) || text->size() > 9 || std::atol(text->c_str()) < min ||
      std::atol(text->c_str()) > max)
    throw CommError(std::string("a Slurm step with ") + name + "='" + text.value_or("") +
                    "': expected an integer from " + std::to_string(min) + " to " + std::to_string(max));
  return static_cast<int>(std::atol(text->c_str()));
}

}  // namespace

std::vector<std::string> expand_slurm_hostlist(const std::string& list) {
  std::vector<std::string> hosts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) malformed(list, "unbalanced or nested brackets");
    if (c == ',' && depth == 0) {
      expand_item(list.substr(start, i - start), list, hosts);
      start = i + 1;
    }
  }
  if (depth != 0) malformed(list, "'[' without ']'");
  return hosts;
}

bool in_slurm_step(const EnvLookup& env) {
  return env("SLURM_STEP_ID") && env("SLURM_PROCID") && env("SLURM_NTASKS");
}

std::vector<std::pair<std::string, std::string>> c10d_variables_from_slurm(const EnvLookup& env) {
  if (!in_slurm_step(env) || env("RANK") || env("WORLD_SIZE")) return {};
  const int world = slurm_int(env, "SLURM_NTASKS", 1, 1 << 20);
  const int rank = slurm_int(env, "SLURM_PROCID", 0, world - 1);
  std::vector<std::pair<std::string, std::string>> set{{"RANK", std::to_string(rank)},
                                                       {"WORLD_SIZE", std::to_string(world)}};
  if (!env("LOCAL_RANK") && env("SLURM_LOCALID"))
    set.emplace_back("LOCAL_RANK", std::to_string(slurm_int(env, "SLURM_LOCALID", 0, 1 << 20)));
  if (!env("MASTER_ADDR")) {
    const auto nodes = env("SLURM_STEP_NODELIST") ? env("SLURM_STEP_NODELIST") : env("SLURM_NODELIST");
    if (!nodes) throw CommError("a Slurm step without SLURM_STEP_NODELIST or SLURM_NODELIST: set MASTER_ADDR to rank 0's host");
    set.emplace_back("MASTER_ADDR", expand_slurm_hostlist(*nodes).front());
  }
  if (!env("MASTER_PORT")) {
    if (!env("SLURM_JOB_ID")) throw CommError("a Slurm step without SLURM_JOB_ID: set MASTER_PORT");
    const auto job = env("SLURM_JOB_ID");
    if (!all_digits(*job)) throw CommError("a Slurm step with SLURM_JOB_ID='" + *job + "': expected a number");
    // The last 9 digits are enough to spread jobs over the 15000 ports.
    const long tail = std::atol(job->substr(job->size() > 9 ? job->size() - 9 : 0).c_str());
    set.emplace_back("MASTER_PORT", std::to_string(15000 + tail % 15000));
  }
  return set;
}

void export_slurm_variables() {
  for (const auto& [name, value] : c10d_variables_from_slurm(env_string))
    ::setenv(name.c_str(), value.c_str(), 0);
}

}  // namespace dtrain
