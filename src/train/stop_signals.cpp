#include "train/stop_signals.h"

#include <csignal>
#include <cstdio>

namespace dtrain::train {
namespace {

volatile std::sig_atomic_t g_received = 0;
struct sigaction g_previous_int {};
struct sigaction g_previous_term {};
struct sigaction g_previous_usr1 {};

void on_signal(int signal_number) {
  if (g_received != 0) {
    // The second one: the user means it. Default action, now.
    std::signal(signal_number, SIG_DFL);
    std::raise(signal_number);
    return;
  }
  g_received = signal_number;
}

}  // namespace

StopSignals::StopSignals() {
  g_received = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  // Restart interrupted system calls: the communicator's reads and writes
  // must not fail because a signal arrived on their thread.
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, &g_previous_int);
  sigaction(SIGTERM, &action, &g_previous_term);
  sigaction(SIGUSR1, &action, &g_previous_usr1);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGTERM, &g_previous_term, nullptr);
  sigaction(SIGUSR1, &g_previous_usr1, nullptr);
}

int StopSignals::received() { return g_received; }

const char* signal_name(int signal_number) {
  if (signal_number == SIGINT) return "SIGINT";
  if (signal_number == SIGTERM) return "SIGTERM";
  if (signal_number == SIGUSR1) return "SIGUSR1";
  static thread_local char text[32];
  std::snprintf(text, sizeof(text), "signal %d", signal_number);
  return text;
}

}  // namespace dtrain::train
