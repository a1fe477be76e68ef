#pragma once

// Where the tests find the source tree, the binaries they start and the Python they run.
//
// The paths live in one generated file (test_paths.cc in the build tree, tests/CMakeLists.txt),
// not on each test's compile line: a clone in another folder then compiles every test object
// exactly as before, and ccache (CCACHE_BASEDIR) serves them all. Only that one small file
// recompiles.

namespace gyre::test_paths {

const char* SourceDir();    // the repository's root
const char* GyreBinary();   // the `gyre` executable
const char* Python();       // the Python the build was configured with (GYRE_PYTHON)
const char* SdkPath();      // python/gyre_env installed into the build tree ("" when absent)
const char* ShardedRank();  // tests/unit/trainer's sharded_rank helper
const char* TpFollower();   // tests/unit/rollout's tp_follower helper

}  // namespace gyre::test_paths

#define GYRE_SOURCE_DIR (::gyre::test_paths::SourceDir())
#define GYRE_BINARY (::gyre::test_paths::GyreBinary())
#define GYRE_PYTHON (::gyre::test_paths::Python())
#define GYRE_SDK_PATH (::gyre::test_paths::SdkPath())
#define GYRE_SHARDED_RANK (::gyre::test_paths::ShardedRank())
#define GYRE_TP_FOLLOWER (::gyre::test_paths::TpFollower())
