#include "crash_report.h"

#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

namespace dtrain::cli {
namespace {

void write_text(const char* text) { [[maybe_unused]] auto written = ::write(STDERR_FILENO, text, std::strlen(text)); }

// Only async-signal-safe calls, but backtrace(), loaded (with libgcc) before
// any signal by report_fatal_signals.
void on_fatal_signal(int signal) {
  write_text("\ndtrain: fatal signal ");
  write_text(sigabbrev_np(signal) ? sigabbrev_np(signal) : "?");
  write_text(" (");
  write_text(sigdescr_np(signal) ? sigdescr_np(signal) : "?");
  write_text("); backtrace (c++filt demangles):\n");
  void* frames[64];
  const int depth = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, depth, STDERR_FILENO);
  std::signal(signal, SIG_DFL);  // then die of it, as without this handler
  std::raise(signal);
}

}  // namespace

void report_fatal_signals() {
  void* warm[1];
  ::backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  for (int signal : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) {
    struct sigaction action {};
    action.sa_handler = on_fatal_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND | SA_NODEFER;
    ::sigaction(signal, &action, nullptr);
  }
}

}  // namespace dtrain::cli
