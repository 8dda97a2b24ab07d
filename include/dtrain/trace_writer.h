// Writing a trace (dtrain/trace.h records it): every rank's events in one
// Chrome trace-event JSON file. Apart from the recorder because it gathers
// the ranks' events over the Communicator, which itself records spans.
#pragma once

#include <string>

namespace dtrain {
class Communicator;
}

namespace dtrain::trace {

// Stops recording and writes every rank's events into one Chrome trace-event
// JSON file at `path` (rank 0 writes it; temp file + rename, so a reader
// never sees half a file). Collective over `world`: every rank must call it.
// Throws on every rank when rank 0 cannot write the file.
void write(const std::string& path, Communicator& world);
// Stops recording and writes this process's events alone.
void write_local(const std::string& path);

}  // namespace dtrain::trace
