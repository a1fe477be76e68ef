// common/file_util: SyncDirectory while another process-like writer renames temporary files in
// the same directory (what sharded trainers do when they save one checkpoint together).
#include "common/file_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

namespace gyre {
namespace {

TEST(FileUtilTest, SyncDirectoryIgnoresFilesRenamedAwayWhileItRuns) {
  char pattern[] = "/tmp/gyre_file_util_XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  ASSERT_TRUE(WriteFileAtomic(dir + "/kept.json", "{}").ok());
  std::atomic<bool> stop{false};
  std::atomic<int> writes{0};
  // The writer: temporary files appear and are renamed into place, over and over.
  std::thread writer([&] {
    while (!stop.load()) {
      for (int k = 0; k < 8; ++k) {
        if (!WriteFileAtomic(dir + "/f" + std::to_string(k), std::string(64, 'x')).ok()) return;
        ++writes;
      }
    }
  });
  int synced = 0;
  Status failed;
  for (int i = 0; i < 1000 && writes.load() < 10000 && failed.ok(); ++i) {
    failed = SyncDirectory(dir);
    ++synced;
  }
  stop = true;
  writer.join();
  EXPECT_TRUE(failed.ok()) << failed;
  EXPECT_GT(writes.load(), 0);
  EXPECT_GT(synced, 0);
  // A directory that is not there is still an error.
  EXPECT_FALSE(SyncDirectory(dir + "/missing").ok());
  EXPECT_TRUE(RemoveTree(dir).ok());
}

}  // namespace
}  // namespace gyre
