#pragma once
// File-system helpers on plain POSIX calls.
//
// Why not std::filesystem: PyTorch's libtorch.so exports its own copies of many
// std::filesystem operations (remove_all, create_directories, rename, file_size, ...). In a
// binary that links libtorch those symbols can bind to libtorch's copies, which crash (seen:
// remove_all jumping to address 0). Gyre therefore uses std::filesystem::path for nothing but
// string handling and does every file-system operation through these functions.

#include <cstdint>
#include <string>
#include <vector>

#include "gyre/status.h"

namespace gyre {

// mkdir -p. OK if the directory already exists.
Status MakeDirs(const std::string& path);
// rm -rf. OK if nothing is there.
Status RemoveTree(const std::string& path);
// rename(2); replaces an existing empty directory or file at `to`.
Status RenamePath(const std::string& from, const std::string& to);
bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);
StatusOr<uint64_t> FileSize(const std::string& path);
// Names of the entries directly inside `dir` (not "." or ".."), sorted.
StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir);
// The whole contents of a regular file.
StatusOr<std::string> ReadFileToString(const std::string& path);

// The line of a process's log that best says why it ended: the last one logged at error or
// critical level or written by a fatal handler ("fatal:", "terminate", "GYRE_CHECK failed",
// "StatusOr::value()"), else the last non-empty line; "" when the file is empty or unreadable.
// Reads at most the last `tail_bytes` of the file.
std::string LastErrorLine(const std::string& path, size_t tail_bytes = 64 << 10);
// `path` made absolute against the current directory (no symlink resolution).
std::string AbsolutePath(const std::string& path);
// $TMPDIR or /tmp.
std::string TempDirectory();
// Copies a regular file (contents only), replacing `to`.
Status CopyFile(const std::string& from, const std::string& to);

// Writes `contents` to `path` atomically: a temporary file beside it, fsync, rename.
Status WriteFileAtomic(const std::string& path, const std::string& contents);

// fsync a file or directory by path (best effort for directories on some file systems).
Status SyncPath(const std::string& path);
// fsync every regular file directly inside `dir`, then `dir` itself.
Status SyncDirectory(const std::string& dir);

}  // namespace gyre
