#pragma once
// Helpers shared by the libFuzzer targets in fuzz/ and the seed generator (make_seeds.cc).
// Header-only and free of libtorch, gRPC and protobuf, so every target can include it.
//
// A fuzz target runs in one process and one thread; these helpers keep no state besides what
// the objects themselves own.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/file_util.h"

namespace gyre::fuzz {

// A file that lives in memory (memfd) but has a path, /proc/self/fd/N, so entry points that take
// a path read the fuzz input without touching a disk. Open() and mmap() of that path see the
// current contents.
class MemFile {
 public:
  explicit MemFile(const char* name) : fd_(::memfd_create(name, MFD_CLOEXEC)) {
    GYRE_CHECK(fd_ >= 0) << "memfd_create failed";
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  // Replaces the contents with `size` bytes at `data`.
  void Set(const void* data, size_t size) {
    GYRE_CHECK(::ftruncate(fd_, 0) == 0 && ::ftruncate(fd_, static_cast<off_t>(size)) == 0);
    const char* p = static_cast<const char*>(data);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pwrite(fd_, p + done, size - done, static_cast<off_t>(done));
      GYRE_CHECK(n > 0) << "pwrite to a memfd failed";
      done += static_cast<size_t>(n);
    }
  }
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

// Writes a file plainly: no temporary file and no fsync (WriteFileAtomic's), since a fuzz loop
// writes thousands per second into a scratch directory.
inline void WriteFile(const std::string& path, const void* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  GYRE_CHECK(f != nullptr) << "cannot write " << path;
  GYRE_CHECK(size == 0 || std::fwrite(data, 1, size, f) == size) << "short write to " << path;
  std::fclose(f);
}
inline void WriteFile(const std::string& path, const std::string& text) {
  WriteFile(path, text.data(), text.size());
}

// A fresh directory for this process: /dev/shm (tmpfs) when it exists, else TempDirectory().
// It is removed when the process exits normally (libFuzzer's -max_total_time or -runs end); one
// left by a crash is named by its pid.
inline std::string ScratchDir(const std::string& tag) {
  const std::string root = IsDirectory("/dev/shm") ? "/dev/shm" : TempDirectory();
  const std::string dir = root + "/gyre_fuzz_" + tag + "_" + std::to_string(::getpid());
  GYRE_CHECK(RemoveTree(dir).ok() && MakeDirs(dir).ok()) << "cannot create " << dir;
  static std::vector<std::string>* dirs = [] {
    auto* v = new std::vector<std::string>();
    std::atexit([] {
      for (const auto& d : *dirs) (void)RemoveTree(d);
    });
    return v;
  }();
  dirs->push_back(dir);
  return dir;
}

// The RPC targets read their input as a sequence of records, one request each:
//   [tag: 1 byte][length: 2 bytes, little-endian][payload: length bytes]
// A length that runs past the end takes what is left, so every input means something.
class RecordReader {
 public:
  RecordReader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool Next(uint8_t* tag, std::string* payload) {
    if (p_ == end_) return false;
    *tag = *p_++;
    size_t len = 0;
    for (int i = 0; i < 2 && p_ != end_; ++i) len |= static_cast<size_t>(*p_++) << (8 * i);
    len = std::min(len, static_cast<size_t>(end_ - p_));
    payload->assign(reinterpret_cast<const char*>(p_), len);
    p_ += len;
    return true;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// One record as RecordReader reads it (the seed generator writes these).
inline std::string Record(uint8_t tag, const std::string& payload) {
  GYRE_CHECK(payload.size() <= 0xffff) << "record payload of " << payload.size() << " bytes";
  std::string out(3, '\0');
  out[0] = static_cast<char>(tag);
  out[1] = static_cast<char>(payload.size() & 0xff);
  out[2] = static_cast<char>(payload.size() >> 8);
  return out + payload;
}

inline std::string AsString(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace gyre::fuzz
