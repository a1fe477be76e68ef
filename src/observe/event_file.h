#pragma once
// TensorBoard event files, written natively: TFRecord framing (length, masked CRC-32C of the
// length, the record, masked CRC-32C of the record) around TensorBoard's Event records. Gyre
// writes scalars; `tensorboard --logdir RUN_DIR/tensorboard` shows them (docs/observability.md).
//
// Thread contract: EventFileWriter is not thread-safe; its owner serialises calls.

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "gyre/status.h"

namespace gyre::observe {

class EventFileWriter {
 public:
  // Creates `dir` if needed and a new file in it named as TensorBoard expects
  // (events.out.tfevents.<unix seconds>.<host>.<pid>), starting with the file-version record.
  static StatusOr<EventFileWriter> Open(const std::string& dir);
  EventFileWriter(EventFileWriter&& other) noexcept;
  EventFileWriter& operator=(EventFileWriter&& other) noexcept;
  ~EventFileWriter();

  // One event holding every (tag, value) pair at `step`; wall_time in seconds since the epoch
  // (the current time when negative). Non-finite values are written as they are.
  Status AddScalars(int64_t step, const std::vector<std::pair<std::string, double>>& values,
                    double wall_time = -1);
  // A session START at `step`: TensorBoard's reader then drops events at steps >= `step` read
  // before it (a resumed job redoes those steps).
  Status AddSessionStart(int64_t step, const std::string& message, double wall_time = -1);
  // Flushes to the operating system (TensorBoard reads files while they grow).
  Status Flush();
  const std::string& path() const { return path_; }

 private:
  EventFileWriter(std::FILE* f, std::string path) : file_(f), path_(std::move(path)) {}
  Status WriteRecord(const std::string& data);
  std::FILE* file_ = nullptr;
  std::string path_;
};

// One record read back from a TFRecord file.
struct EventRecord {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  bool session_start = false;
  std::vector<std::pair<std::string, float>> scalars;
  std::vector<bool> has_value;  // per scalar: the record holds a number (not just a tag)
};

// Reads every record of an event file, checking both checksums of each; a truncated last record
// (a writer still running) ends the list, any other damage is a DataLoss naming the offset.
StatusOr<std::vector<EventRecord>> ReadEventFile(const std::string& path);

// The mask TFRecord applies to stored CRCs (exposed for tests).
uint32_t MaskedCrc32c(const void* data, size_t n);

}  // namespace gyre::observe
