// A fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) in a dtrain
// process prints which one and a backtrace to stderr, then ends the process
// as the signal would (the same exit status). The H200 run of 2026-12-04 saw
// every resumed run die with exit 139 and not a word: a GPU machine is lent
// for minutes, and a backtrace in the log is the one clue that comes back.
#pragma once

namespace dtrain::cli {

void report_fatal_signals();

}  // namespace dtrain::cli
