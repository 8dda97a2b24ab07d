// Collective helpers for save and load: every rank fails together (never one
// rank throwing while the others wait in a collective), and small strings
// travel to every rank. A null communicator means a single process.
#pragma once

#include <dtrain/comm.h>

#include <string>
#include <vector>

namespace dtrain::detail {

// Collective. If any rank's `error` is non-empty, every rank throws
// std::runtime_error: its own error, or one saying which rank failed.
void agree_or_throw(const CommPtr& comm, const std::string& error);

// Collective: every rank's `text`, in rank order.
std::vector<std::string> all_gather_strings(const CommPtr& comm, const std::string& text);

// Collective: elementwise maximum of `flags` over ranks.
std::vector<int64_t> all_max(const CommPtr& comm, std::vector<int64_t> flags);

}  // namespace dtrain::detail
