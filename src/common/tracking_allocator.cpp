// The tracking CPU allocator (include/dtrain/memory.h).
//
// Each allocation carries its size in a header of kHeaderBytes just before
// the bytes the tensor sees, so freeing needs no lookup table and no lock.
// The DataPtr's context is its data pointer and raw_deleter() is set: ATen's
// oneDNN kernels allocate through raw_allocate(), which requires exactly that
// (keeping the size in a separate context object breaks them). Tensors that
// existed before installation keep their own deleter.
#include "dtrain/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

namespace dtrain::memory {
namespace {

// A multiple of the CPU allocator's 64-byte alignment, so the tensor's bytes
// stay as aligned as the wrapped allocator made them.
constexpr size_t kHeaderBytes = 64;

std::atomic<int64_t> g_live_bytes{0};
std::atomic<int64_t> g_peak_bytes{0};
std::atomic<bool> g_installed{false};
std::atomic<int64_t> g_limit_bytes{0};  // 0: no cap
c10::Allocator* g_wrapped = nullptr;  // LibTorch's default CPU allocator; set once before any allocation

void raise_peak(int64_t live) {
  int64_t peak = g_peak_bytes.load(std::memory_order_relaxed);
  while (live > peak && !g_peak_bytes.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

void delete_tracked(void* data) {
  if (data == nullptr) return;
  auto* base = static_cast<std::byte*>(data) - kHeaderBytes;
  int64_t bytes;
  std::memcpy(&bytes, base, sizeof(bytes));
  g_live_bytes.fetch_sub(bytes, std::memory_order_relaxed);
  g_wrapped->raw_deallocate(base);
}

// The rank as the launcher numbered it, for the out-of-memory message (the
// allocator knows no communicator).
std::string rank_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK"}) {
    if (const char* value = std::getenv(name)) return value;
  }
  return "0";
}

std::mutex g_phase_mutex;
std::string g_phase, g_advice;  // guarded by g_phase_mutex

void check_limit(int64_t bytes) {
  const int64_t limit = g_limit_bytes.load(std::memory_order_relaxed);
  if (limit <= 0) return;
  const int64_t live = g_live_bytes.load(std::memory_order_relaxed);
  if (live + bytes <= limit) return;
  std::string phase, advice;
  {
    std::lock_guard<std::mutex> lock(g_phase_mutex);
    phase = g_phase;
    advice = g_advice;
  }
  if (advice.empty()) advice = "Shard the model (--strategy fsdp), use more ranks, a smaller batch, or raise the cap.";
  TORCH_CHECK_WITH(OutOfMemoryError, false, "dtrain: rank ", rank_from_environment(), " is out of memory",
                   phase.empty() ? "" : " during the " + phase, ": a tensor of ", bytes,
                   " bytes would bring this rank's live tensor memory to ", live + bytes, " bytes, over its cap of ",
                   limit, " bytes (DTRAIN_MEMORY_CAP_MB). ", advice);
}

class TrackingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, &delete_tracked, cpu};
    const auto bytes = static_cast<int64_t>(n);
    check_limit(bytes);
    auto* base = static_cast<std::byte*>(g_wrapped->raw_allocate(n + kHeaderBytes));
    std::memcpy(base, &bytes, sizeof(bytes));
    raise_peak(g_live_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes);
    void* data = base + kHeaderBytes;
    return {data, data, &delete_tracked, cpu};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_tracked; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

}  // namespace

void install_tracking_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Static: tensors allocated through it may outlive any scope, and c10
    // only keeps the pointer.
    g_wrapped = c10::GetCPUAllocator();
    if (g_wrapped->raw_deleter() == nullptr)
      throw std::runtime_error("the CPU allocator in use has no raw interface; dtrain cannot track its memory");
    static TrackingAllocator tracking;
    c10::SetCPUAllocator(&tracking);
    g_installed = true;
    if (const char* cap = std::getenv("DTRAIN_MEMORY_CAP_MB")) {
      char* end = nullptr;
      const double mib = std::strtod(cap, &end);
      if (end == cap || *end != '\0' || !(mib >= 0))
        throw std::invalid_argument(std::string("DTRAIN_MEMORY_CAP_MB='") + cap + "' must be a number of MiB (0: no cap)");
      set_limit_bytes(static_cast<int64_t>(mib * 1024 * 1024));
    }
  });
}

bool tracking_allocator_installed() { return g_installed.load(); }

void set_limit_bytes(int64_t bytes) { g_limit_bytes.store(bytes > 0 ? bytes : 0, std::memory_order_relaxed); }

int64_t limit_bytes() { return g_limit_bytes.load(std::memory_order_relaxed); }

int64_t live_bytes() { return g_live_bytes.load(std::memory_order_relaxed); }

int64_t peak_bytes() { return g_peak_bytes.load(std::memory_order_relaxed); }

void reset_peak() { g_peak_bytes.store(g_live_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed); }

Phase::Phase(std::string what, std::optional<std::string> advice) {
  std::lock_guard<std::mutex> lock(g_phase_mutex);
  previous_what_ = std::exchange(g_phase, std::move(what));
  previous_advice_ = g_advice;
  if (advice) g_advice = std::move(*advice);
}

Phase::~Phase() {
  std::lock_guard<std::mutex> lock(g_phase_mutex);
  g_phase = std::move(previous_what_);
  g_advice = std::move(previous_advice_);
}

void set_phase(std::string what, std::optional<std::string> advice) {
  std::lock_guard<std::mutex> lock(g_phase_mutex);
  g_phase = std::move(what);
  if (advice) g_advice = std::move(*advice);
}

std::string current_phase() {
  std::lock_guard<std::mutex> lock(g_phase_mutex);
  return g_phase;
}

int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    return std::stoll(line.substr(6)) * 1024;  // "VmHWM:   123456 kB"
  }
  return 0;
}

}  // namespace dtrain::memory
