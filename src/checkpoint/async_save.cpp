// See async_save.h and Note [the writer's own communicator] there.
#include "checkpoint/async_save.h"

#include <stdexcept>
#include <utility>

namespace dtrain::detail {

BackgroundCheckpointWriter::BackgroundCheckpointWriter(const CommPtr& world)
    : comm_(world && world->size() > 1 ? world->split(0, world->rank()) : nullptr) {}

BackgroundCheckpointWriter::~BackgroundCheckpointWriter() {
  if (writer_.joinable()) writer_.join();
}

void BackgroundCheckpointWriter::wait() {
  if (writer_.joinable()) writer_.join();
  in_flight_ = 0;
  if (auto error = std::exchange(error_, nullptr)) std::rethrow_exception(error);
}

void BackgroundCheckpointWriter::save(const std::string& dir, const HeldModel& held, torch::optim::Optimizer* optimizer,
                                      int64_t step, const std::map<std::string, std::string>& extra,
                                      std::function<void()> published) {
  wait();  // one save at a time; its buffer is the one reused below
  SaveRequest request{dir, step, held.rank, held.world_size, held.strategy, held.optimizer_kind, extra};
  // As a blocking save does: a failure to build or copy this rank's file is
  // carried into the writer's agreement, so every rank fails together.
  std::string error;
  try {
    if (request.optimizer_kind.empty()) request.optimizer_kind = optimizer_kind(optimizer);
    file_ = rank_file_of(held, optimizer);
    staging_.stage(file_);
  } catch (const std::exception& e) {
    file_ = RankFile();
    error = e.what();
  }
  in_flight_ = step;
  writer_ = std::thread([this, request = std::move(request), error = std::move(error),
                         published = std::move(published)]() mutable {
    try {
      write_checkpoint(request, file_, std::move(error), comm_);
      if (published) published();
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

}  // namespace dtrain::detail
