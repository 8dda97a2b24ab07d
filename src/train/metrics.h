// The --metrics file: JSON Lines, one object per line, written by rank 0 as
// training goes (each line is flushed, so a reader can follow a running job).
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

namespace dtrain {
struct TrainConfig;
struct TrainResult;
}  // namespace dtrain

namespace dtrain::train {

// The fields every run's last metrics line has ("final": true, steps, loss,
// eval_loss, ..., stopped_by), from `result`; each loop adds its own after them.
nlohmann::ordered_json final_record(const TrainConfig& config, const TrainResult& result, int64_t parameters);

// The median of `values` (0 for none): the step time the final line reports.
double median(std::vector<double> values);

class MetricsWriter {
 public:
  // Writes nothing.
  MetricsWriter() = default;
  // Creates `path` afresh (an existing file is replaced), or with `append`
  // adds to it (a resumed run). Throws std::runtime_error naming the path
  // when it cannot be created, e.g. because its folder does not exist.
  explicit MetricsWriter(const std::string& path, bool append = false);

  bool enabled() const { return file_.is_open(); }
  // Appends `record` as one line and flushes it. Non-finite numbers are
  // written as null.
  void write(const nlohmann::ordered_json& record);

 private:
  std::string path_;
  std::ofstream file_;
};

}  // namespace dtrain::train
