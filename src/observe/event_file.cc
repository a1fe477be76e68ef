#include "observe/event_file.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/crc32.h"
#include "common/file_util.h"
#include "tensorboard/event.pb.h"

namespace gyre::observe {

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void PutLe64(uint64_t v, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void PutLe32(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t GetLe(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

uint32_t MaskedCrc32c(const void* data, size_t n) {
  const uint32_t crc = Crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

StatusOr<EventFileWriter> EventFileWriter::Open(const std::string& dir) {
  GYRE_RETURN_IF_ERROR(MakeDirs(dir));
  char host[256] = "localhost";
  (void)gethostname(host, sizeof(host) - 1);
  const std::string base = dir + "/events.out.tfevents." +
                           std::to_string(static_cast<int64_t>(Now())) + "." + host + "." +
                           std::to_string(getpid());
  // A second file of the same process within the same second gets a suffix (which also sorts
  // after the first, as TensorBoard's reader orders files by name).
  std::string path = base;
  std::FILE* f = nullptr;
  for (int n = 1; n < 1000; ++n) {
    f = std::fopen(path.c_str(), "wbx");
    if (f != nullptr || errno != EEXIST) break;
    path = base + "." + std::to_string(n);
  }
  if (f == nullptr) {
    return Unavailable("cannot create the TensorBoard event file " + path + ": " +
                       std::strerror(errno));
  }
  EventFileWriter w(f, path);
  tensorboard::Event e;
  e.set_wall_time(Now());
  e.set_file_version("brain.Event:2");
  GYRE_RETURN_IF_ERROR(w.WriteRecord(e.SerializeAsString()));
  GYRE_RETURN_IF_ERROR(w.Flush());
  return w;
}

EventFileWriter::EventFileWriter(EventFileWriter&& other) noexcept
    : file_(std::exchange(other.file_, nullptr)), path_(std::move(other.path_)) {}

EventFileWriter& EventFileWriter::operator=(EventFileWriter&& other) noexcept {
  if (this != &other) {
    if (file_ != nullptr) std::fclose(file_);
    file_ = std::exchange(other.file_, nullptr);
    path_ = std::move(other.path_);
  }
  return *this;
}

EventFileWriter::~EventFileWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

Status EventFileWriter::WriteRecord(const std::string& data) {
  if (file_ == nullptr) return FailedPrecondition("the event file is closed");
  char header[12];
  PutLe64(data.size(), header);
  PutLe32(MaskedCrc32c(header, 8), header + 8);
  char footer[4];
  PutLe32(MaskedCrc32c(data.data(), data.size()), footer);
  if (std::fwrite(header, 1, sizeof(header), file_) != sizeof(header) ||
      std::fwrite(data.data(), 1, data.size(), file_) != data.size() ||
      std::fwrite(footer, 1, sizeof(footer), file_) != sizeof(footer)) {
    return Unavailable("cannot write " + path_ + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

Status EventFileWriter::AddScalars(int64_t step,
                                   const std::vector<std::pair<std::string, double>>& values,
                                   double wall_time) {
  tensorboard::Event e;
  e.set_wall_time(wall_time < 0 ? Now() : wall_time);
  e.set_step(step);
  auto* summary = e.mutable_summary();
  for (const auto& [tag, value] : values) {
    auto* v = summary->add_value();
    v->set_tag(tag);
    // Beyond float's range a cast is undefined; TensorBoard shows the infinity instead.
    const double limit = std::numeric_limits<float>::max();
    v->set_simple_value(std::isnan(value) ? std::numeric_limits<float>::quiet_NaN()
                        : value > limit   ? std::numeric_limits<float>::infinity()
                        : value < -limit  ? -std::numeric_limits<float>::infinity()
                                          : static_cast<float>(value));
  }
  return WriteRecord(e.SerializeAsString());
}

Status EventFileWriter::AddSessionStart(int64_t step, const std::string& message,
                                        double wall_time) {
  tensorboard::Event e;
  e.set_wall_time(wall_time < 0 ? Now() : wall_time);
  e.set_step(step);
  e.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  e.mutable_session_log()->set_msg(message);
  return WriteRecord(e.SerializeAsString());
}

Status EventFileWriter::Flush() {
  if (file_ != nullptr && std::fflush(file_) != 0) {
    return Unavailable("cannot write " + path_ + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

StatusOr<std::vector<EventRecord>> ReadEventFile(const std::string& path) {
  GYRE_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  std::vector<EventRecord> out;
  size_t at = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  while (at < bytes.size()) {
    if (bytes.size() - at < 12) break;  // a record still being written
    const uint64_t len = GetLe(p + at, 8);
    if (static_cast<uint32_t>(GetLe(p + at + 8, 4)) != MaskedCrc32c(p + at, 8)) {
      return DataLoss(path + ": the length of the record at byte " + std::to_string(at) +
                      " fails its checksum");
    }
    if (len > bytes.size() - at - 12 || bytes.size() - at - 12 - len < 4) break;
    const unsigned char* data = p + at + 12;
    if (static_cast<uint32_t>(GetLe(data + len, 4)) != MaskedCrc32c(data, len)) {
      return DataLoss(path + ": the record at byte " + std::to_string(at) + " fails its checksum");
    }
    tensorboard::Event e;
    if (!e.ParseFromArray(data, static_cast<int>(len))) {
      return DataLoss(path + ": the record at byte " + std::to_string(at) +
                      " is not a TensorBoard event");
    }
    EventRecord r;
    r.wall_time = e.wall_time();
    r.step = e.step();
    r.file_version = e.file_version();
    r.session_start =
        e.has_session_log() && e.session_log().status() == tensorboard::SessionLog::START;
    for (const auto& v : e.summary().value()) {
      r.scalars.emplace_back(v.tag(), v.simple_value());
      r.has_value.push_back(v.value_case() == tensorboard::SummaryValue::kSimpleValue);
    }
    out.push_back(std::move(r));
    at += 12 + len + 4;
  }
  return out;
}

}  // namespace gyre::observe
