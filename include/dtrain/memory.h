// Memory accounting per rank: the CPU analogue of
// torch.cuda.max_memory_allocated, and the process's peak resident set.
//
//   dtrain::memory::install_tracking_allocator();   // once, before the tensors to count
//   ... train ...
//   dtrain::memory::peak_bytes();                   // most tensor bytes live at once
//
// The tracking allocator wraps LibTorch's default CPU allocator (installed
// with c10::SetCPUAllocator): every CPU tensor allocated after installing it
// is counted while it lives, in every thread (the compute thread, the
// communicator's thread, intra-op workers). Tensors allocated before
// installing it are not counted, and freeing them does not change the counts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dtrain::memory {

// Installs the tracking allocator as the process's CPU allocator. Idempotent
// and thread-safe; it stays installed for the life of the process.
void install_tracking_allocator();
bool tracking_allocator_installed();

// Bytes of CPU tensor storage allocated through the tracking allocator and
// not yet freed.
int64_t live_bytes();
// The most live_bytes() has been since installing or the last reset_peak().
int64_t peak_bytes();
// Starts a new peak window at the current live bytes.
void reset_peak();

// A per-rank cap on live tensor bytes (0: none). An allocation that would
// exceed it throws c10::OutOfMemoryError naming the rank, the bytes asked
// and the cap, instead of letting the machine swap or the kernel kill the
// job. install_tracking_allocator() reads DTRAIN_MEMORY_CAP_MB.
void set_limit_bytes(int64_t bytes);
int64_t limit_bytes();

// What this rank is doing, for the out-of-memory message: "rank 2 is out of
// memory during the forward of FSDP unit 'blocks.3'", followed by `advice`
// (what would help; without it the advice in force stays, and with none
// at all the message gives general advice). A Phase names the process's
// activity while it lives and restores the previous one (set_phase replaces
// it until the next change).
class Phase {
 public:
  explicit Phase(std::string what, std::optional<std::string> advice = std::nullopt);
  ~Phase();
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  std::string previous_what_, previous_advice_;
};
void set_phase(std::string what, std::optional<std::string> advice = std::nullopt);
std::string current_phase();

// The process's peak resident set size (VmHWM in /proc/self/status), in
// bytes; 0 where the kernel does not report it.
int64_t peak_rss_bytes();

}  // namespace dtrain::memory
