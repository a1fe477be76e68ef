#include "common/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace gyre {

namespace {

Status Errno(const std::string& what, const std::string& path) {
  return Unavailable(what + " " + path + ": " + std::strerror(errno));
}

}  // namespace

Status MakeDirs(const std::string& path) {
  if (path.empty()) return InvalidArgument("MakeDirs: empty path");
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      return Errno("cannot create directory", partial);
    }
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Unavailable("cannot create directory " + path + ": a file is in the way");
  }
  return Status::Ok();
}

Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return Status::Ok();
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) != 0) return Errno("cannot remove", path);
    return Status::Ok();
  }
  auto fn = [](const char* p, const struct stat*, int, struct FTW*) -> int {
    return ::remove(p) == 0 ? 0 : -1;
  };
  if (::nftw(path.c_str(), fn, 16, FTW_DEPTH | FTW_PHYS) != 0) return Errno("cannot remove", path);
  return Status::Ok();
}

Status RenamePath(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) return Errno("cannot rename " + from + " to", to);
  return Status::Ok();
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

StatusOr<uint64_t> FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Errno("cannot stat", path);
  return static_cast<uint64_t>(st.st_size);
}

StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return Errno("cannot open directory", dir);
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

StatusOr<std::string> ReadFileToString(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = Errno("cannot read", path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

std::string AbsolutePath(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  char buf[4096];
  if (::getcwd(buf, sizeof(buf)) == nullptr) return path;
  std::string out = buf;
  if (path.empty() || path == ".") return out;
  return out + "/" + (path.rfind("./", 0) == 0 ? path.substr(2) : path);
}

std::string TempDirectory() {
  const char* t = std::getenv("TMPDIR");
  return (t && *t) ? t : "/tmp";
}

Status CopyFile(const std::string& from, const std::string& to) {
  int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return Errno("cannot open", from);
  int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    ::close(in);
    return Errno("cannot create", to);
  }
  char buf[1 << 16];
  ssize_t n;
  Status s;
  while ((n = ::read(in, buf, sizeof(buf))) > 0) {
    if (::write(out, buf, static_cast<size_t>(n)) != n) {
      s = Errno("short write to", to);
      break;
    }
  }
  if (n < 0) s = Errno("cannot read", from);
  ::close(in);
  ::close(out);
  return s;
}

Status SyncPath(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  ::fsync(fd);
  ::close(fd);
  return Status::Ok();
}

Status WriteFileAtomic(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", tmp);
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = Errno("cannot write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    Status s = Errno("cannot flush", tmp);
    ::unlink(tmp.c_str());
    return s;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = Errno("cannot rename into place", path);
    ::unlink(tmp.c_str());
    return s;
  }
  return Status::Ok();
}

Status SyncDirectory(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return Errno("cannot open directory", dir);
  Status s;
  while (struct dirent* e = ::readdir(d)) {
    const std::string path = dir + "/" + e->d_name;
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      s = SyncPath(path);
      // Another process writing into the same directory (sharded trainers saving one
      // checkpoint) may rename its temporary file away between the listing and the open: a
      // file that is gone is not this call's to sync.
      if (!s.ok() && !PathExists(path)) s = Status::Ok();
      if (!s.ok()) break;
    }
  }
  ::closedir(d);
  GYRE_RETURN_IF_ERROR(s);
  return SyncPath(dir);
}

std::string LastErrorLine(const std::string& path, size_t tail_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  const std::streamoff start = size > static_cast<std::streamoff>(tail_bytes)
                                   ? size - static_cast<std::streamoff>(tail_bytes)
                                   : 0;
  in.seekg(start);
  std::string text(static_cast<size_t>(size - start), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  // Colour codes from spdlog's terminal sink would hide "[error]" and garble the message.
  std::string clean;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\x1b') {
      while (i < text.size() && text[i] != 'm') ++i;
      continue;
    }
    clean += text[i];
  }
  std::istringstream lines(clean);
  std::string line, last, last_error;
  bool first = start > 0;  // a cut first line is not a whole line
  while (std::getline(lines, line)) {
    if (first) {
      first = false;
      continue;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    last = line;
    for (const char* mark :
         {"[error]", "[critical]", "fatal:", "terminate called", "GYRE_CHECK failed",
          "StatusOr::value()", "AddressSanitizer", "runtime error:"}) {
      if (line.find(mark) != std::string::npos) {
        last_error = line;
        break;
      }
    }
  }
  std::string out = last_error.empty() ? last : last_error;
  constexpr size_t kMaxChars = 400;
  if (out.size() > kMaxChars) out = out.substr(0, kMaxChars) + "...";
  return out;
}

}  // namespace gyre
