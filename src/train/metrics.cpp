#include "train/metrics.h"

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace dtrain::train {

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  file_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
  if (!file_)
    throw std::runtime_error("cannot create the metrics file '" + path + "': " + std::strerror(errno) +
                             " (does its folder exist?)");
}

void MetricsWriter::write(const nlohmann::ordered_json& record) {
  if (!enabled()) return;
  // dump() writes NaN and infinity as null, which keeps every line valid JSON.
  file_ << record.dump() << '\n';
  file_.flush();
  if (!file_) throw std::runtime_error("cannot write to the metrics file '" + path_ + "'");
}

}  // namespace dtrain::train
