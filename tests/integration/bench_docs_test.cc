// The documentation's benchmark figures come from reference result files: bench/baselines/
// holds one gyre-bench/1 file per benchmark, each is cited by a generated block in the docs, and
// `gyre bench docs --check` finds every block equal to what its file gives. A real (small)
// kernels run then shows the generator rewriting a stale block, choosing columns, and refusing
// bad blocks without touching the file.

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "integration/run_util.h"
#include "test_paths.h"

namespace gyre::testing {
namespace {

const std::string kSource = GYRE_SOURCE_DIR;

std::vector<std::string> Markdown() {
  std::vector<std::string> files = {kSource + "/README.md"};
  auto docs = ListDirectory(kSource + "/docs");
  EXPECT_TRUE(docs.ok());
  for (const auto& f : *docs) {
    if (f.size() > 3 && f.substr(f.size() - 3) == ".md") files.push_back(kSource + "/docs/" + f);
  }
  return files;
}

TEST(BenchDocsTest, EveryReferenceResultIsValidAndTheDocsShowItsFigures) {
  const std::string dir = MakeTempDir("bench_docs_ref");
  auto listed = ListDirectory(kSource + "/bench/baselines");
  ASSERT_TRUE(listed.ok()) << "bench/baselines/ is missing";
  std::vector<std::string> results;
  for (const auto& f : *listed) {
    if (f.size() > 5 && f.substr(f.size() - 5) == ".json") results.push_back(f);
  }
  // One per benchmark (rollout twice: the random model's long tail and SmolLM2's ceiling).
  for (const char* bench :
       {"kernels", "weight-sync", "rollout", "train", "memory", "dp-step", "e2e"}) {
    EXPECT_NE(std::find(results.begin(), results.end(), std::string(bench) + ".json"),
              results.end())
        << "no bench/baselines/" << bench << ".json";
  }
  std::string all_docs;
  for (const auto& md : Markdown()) all_docs += ReadFile(md);
  for (const auto& f : results) {
    SCOPED_TRACE(f);
    const std::string path = kSource + "/bench/baselines/" + f;
    const auto j = nlohmann::json::parse(ReadFile(path));
    EXPECT_EQ(j["schema"], "gyre-bench/1");
    const std::string bench = j["benchmark"].get<std::string>();
    EXPECT_EQ(f.rfind(bench, 0), 0u) << "the file name starts with its benchmark's name";
    EXPECT_EQ(j["options"][0], bench) << "the command line that measured it is recorded";
    EXPECT_FALSE(j["results"].empty());
    EXPECT_FALSE(j["columns"].empty()) << "written by a gyre that records its table's columns";
    EXPECT_FALSE(j["metrics"].empty());
    // Usable as the A side of a comparison.
    auto [rc, out] = RunGyre({"bench", "compare", path, path}, dir);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find(" 0 regression(s)"), std::string::npos) << out;
    // Cited by a generated block somewhere in the docs.
    EXPECT_NE(all_docs.find("<!-- gyre-bench: ../bench/baselines/" + f), std::string::npos)
        << "no doc shows " << f;
  }
  std::vector<std::string> args = {"bench", "docs", "--check"};
  for (const auto& md : Markdown()) args.push_back(md);
  auto [rc, out] = RunGyre(args, dir);
  EXPECT_EQ(rc, 0) << "a doc's table differs from its result file (tools/bench-baselines.sh "
                      "regenerates them):\n"
                   << out;
  EXPECT_NE(out.find(", 0 stale"), std::string::npos) << out;
  (void)RemoveTree(dir);
}

TEST(BenchDocsTest, RegeneratesStaleBlocksAndRefusesBadOnesWithoutWriting) {
  const std::string dir = MakeTempDir("bench_docs");
  auto [rc, out] =
      RunGyre({"bench", "kernels", "--device", "cpu", "--vocab", "1031", "--batch", "1,3",
               "--response-len", "64", "--min-time", "0.01", "--json", dir + "/k.json"},
              dir);
  ASSERT_EQ(rc, 0) << out;
  const auto k = nlohmann::json::parse(ReadFile(dir + "/k.json"));
  ASSERT_FALSE(k["columns"].empty());
  ASSERT_EQ(k["columns"][0]["key"], "kernel");
  const std::string md = dir + "/doc.md";
  const std::string stale =
      "# Figures\n\nSome text.\n<!-- gyre-bench: k.json -->\n| old | table |\n"
      "<!-- /gyre-bench -->\nMore text, quoting `<!-- gyre-bench: FILE -->` and "
      "`<!-- /gyre-bench -->`.\n";
  ASSERT_TRUE(WriteFileAtomic(md, stale).ok());

  std::tie(rc, out) = RunGyre({"bench", "docs", "--check", md}, dir);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("doc.md:4: k.json"), std::string::npos) << out;
  EXPECT_EQ(ReadFile(md), stale) << "--check writes nothing";

  std::tie(rc, out) = RunGyre({"bench", "docs", md}, dir);
  EXPECT_EQ(rc, 0) << out;
  const std::string doc = ReadFile(md);
  EXPECT_EQ(doc.find("| old | table |"), std::string::npos) << doc;
  EXPECT_EQ(doc.rfind("# Figures\n\nSome text.\n<!-- gyre-bench: k.json -->\n", 0), 0u) << doc;
  EXPECT_NE(doc.find("<!-- /gyre-bench -->\nMore text, quoting `<!-- gyre-bench: FILE -->` and "
                     "`<!-- /gyre-bench -->`.\n"),
            std::string::npos)
      << doc;
  // The command, and a table with the columns the benchmark printed and every row's figures.
  EXPECT_NE(doc.find("Measured by `gyre bench kernels --device cpu --vocab 1031"),
            std::string::npos)
      << doc;
  std::string header = "|";
  for (const auto& c : k["columns"]) header += " " + c["header"].get<std::string>() + " |";
  EXPECT_NE(doc.find(header + "\n"), std::string::npos) << header << "\n" << doc;
  size_t rows = 0;
  for (size_t at = doc.find("\n| "); at != std::string::npos; at = doc.find("\n| ", at + 1)) {
    ++rows;
  }
  EXPECT_EQ(rows, k["results"].size() + 1) << doc;  // + the header
  const auto& first = k["results"][0];
  char speedup[32];
  std::snprintf(speedup, sizeof(speedup), "%.2f", first["speedup"].get<double>());
  EXPECT_NE(
      doc.find("| " + first["kernel"].get<std::string>() + " | " + first["batch"].dump() + " |"),
      std::string::npos)
      << doc;
  EXPECT_NE(doc.find(std::string(" ") + speedup + " |"), std::string::npos) << speedup << doc;
  std::tie(rc, out) = RunGyre({"bench", "docs", "--check", md}, dir);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("1 block(s) in 1 file(s), 0 stale"), std::string::npos) << out;

  // Chosen columns.
  ASSERT_TRUE(WriteFileAtomic(
                  md, "<!-- gyre-bench: k.json columns=kernel,speedup -->\n<!-- /gyre-bench -->\n")
                  .ok());
  std::tie(rc, out) = RunGyre({"bench", "docs", md}, dir);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(ReadFile(md).find("\n| kernel | speedup |\n|---|---:|\n"), std::string::npos)
      << ReadFile(md);

  // Bad blocks: a clear error naming the line, and the file as it was.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"<!-- gyre-bench: missing.json -->\n<!-- /gyre-bench -->\n", "missing.json"},
      {"<!-- gyre-bench: k.json columns=nope -->\n<!-- /gyre-bench -->\n", "no row of k.json"},
      {"<!-- gyre-bench: k.json rows=3 -->\n<!-- /gyre-bench -->\n", "unknown marker option"},
      {"text\n<!-- gyre-bench: k.json -->\nno end\n", "doc.md:2: the block has no closing"},
      {"<!-- /gyre-bench -->\n", "without an opening"},
      {"<!-- gyre-bench: doc.md -->\n<!-- /gyre-bench -->\n", "not a gyre bench result"},
  };
  for (const auto& [text, message] : bad) {
    SCOPED_TRACE(text);
    ASSERT_TRUE(WriteFileAtomic(md, text).ok());
    std::tie(rc, out) = RunGyre({"bench", "docs", md}, dir);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find(message), std::string::npos) << out;
    EXPECT_NE(out.find("nothing written"), std::string::npos) << out;
    EXPECT_EQ(ReadFile(md), text);
  }
  std::tie(rc, out) = RunGyre({"bench", "docs"}, dir);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_EQ(out, "gyre bench docs: FILE.md is required (see gyre bench docs --help)\n");
  (void)RemoveTree(dir);
}

}  // namespace
}  // namespace gyre::testing
