// Writing a trace: every rank's events to rank 0, one file, atomically.
#include "trace/trace_json.h"

#include "common/device_spans.h"

#include "dtrain/comm.h"
#include "dtrain/trace_writer.h"

#include <torch/types.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>

namespace dtrain::trace {
namespace {

// Writes next to `path` and renames over it, so that a reader (or a crash)
// never sees half a file. Returns "" or what went wrong.
std::string write_atomically(const std::string& path, const std::string& text) {
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) {
      return "cannot create '" + temp + "': " + std::strerror(errno) +
             " (does the directory exist, and may this user write there?)";
    }
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.close();
    if (!out) {
      std::remove(temp.c_str());
      return "cannot write '" + temp + "' (disk full?)";
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(temp.c_str());
    return "cannot rename '" + temp + "' to '" + path + "': " + why;
  }
  return "";
}

// This process's events, and a warning when some were dropped.
std::string local_events(int pid) {
  flush_device_spans(/*wait=*/true);  // GPU spans become events once their events have run
  const auto threads = detail::snapshot();
  uint64_t dropped = 0;
  for (const auto& thread : threads) dropped += thread.dropped;
  if (dropped > 0) {
    std::cerr << "dtrain trace: rank " << pid << " dropped " << dropped << " events beyond "
              << detail::kMaxEventsPerThread << " per thread; the trace covers the start of the run only"
              << std::endl;
  }
  return detail::events_json(threads, pid);
}

// Rank 0 receives every other rank's events in rank order (send/recv: no
// rank but 0 holds more than its own events).
std::vector<std::string> gather_to_rank0(Communicator& world, std::string mine) {
  std::vector<std::string> all;
  const int rank = world.rank();
  if (rank != 0) {
    auto length = torch::tensor({static_cast<int64_t>(mine.size())}, torch::kInt64);
    world.send(length, 0)->wait();
    auto bytes = torch::from_blob(mine.data(), {static_cast<int64_t>(mine.size())}, torch::kUInt8);
    world.send(bytes, 0)->wait();
    return all;
  }
  all.push_back(std::move(mine));
  for (int peer = 1; peer < world.size(); ++peer) {
    auto length = torch::zeros({1}, torch::kInt64);
    world.recv(length, peer)->wait();
    auto bytes = torch::empty({length.item<int64_t>()}, torch::kUInt8);
    world.recv(bytes, peer)->wait();
    all.emplace_back(static_cast<const char*>(bytes.const_data_ptr()), static_cast<size_t>(bytes.numel()));
  }
  return all;
}

}  // namespace

void write(const std::string& path, Communicator& world) {
  // Its own collectives below are not part of the run.
  stop();
  const auto all = gather_to_rank0(world, local_events(world.rank()));
  std::string failure;
  if (world.rank() == 0) failure = write_atomically(path, detail::trace_file_json(all));
  // Every rank learns whether the file exists, so none reports success alone.
  auto failed = torch::tensor({failure.empty() ? 0 : 1}, torch::kInt32);
  world.blocking().broadcast(failed, 0);
  if (!failure.empty()) throw std::runtime_error("dtrain trace: " + failure);
  if (failed.item<int>() != 0)
    throw std::runtime_error("dtrain trace: rank 0 could not write the trace to '" + path + "' (see rank 0's error)");
}

void write_local(const std::string& path) {
  stop();
  const auto failure = write_atomically(path, detail::trace_file_json({local_events(detail::traced_rank())}));
  if (!failure.empty()) throw std::runtime_error("dtrain trace: " + failure);
}

}  // namespace dtrain::trace
