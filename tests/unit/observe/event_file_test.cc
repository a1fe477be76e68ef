#include "observe/event_file.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "observe/report.h"
#include "observe/run_metrics.h"

namespace gyre::observe {
namespace {

std::string FreshDir(const std::string& tag) {
  const std::string dir = ::testing::TempDir() + "/observe_" + tag + "_" + std::to_string(getpid());
  (void)RemoveTree(dir);
  return dir;
}

std::vector<std::string> EventFiles(const std::string& dir) {
  std::vector<std::string> out;
  auto names = ListDirectory(dir);
  if (!names.ok()) return out;
  for (const auto& n : *names) {
    if (n.rfind("events.out.tfevents.", 0) == 0) out.push_back(dir + "/" + n);
  }
  return out;
}

TEST(EventFileTest, ScalarsAndMarkersReadBackWithTheirSteps) {
  const std::string dir = FreshDir("roundtrip");
  auto w = EventFileWriter::Open(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(
      w->AddScalars(3, {{"mean_reward", 0.25}, {"loss", -1.5}, {"zero", 0.0}}, 1000.5).ok());
  ASSERT_TRUE(w->AddSessionStart(2, "resumed", 1001).ok());
  ASSERT_TRUE(w->Flush().ok());
  auto records = ReadEventFile(w->path());
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 3u);
  EXPECT_EQ((*records)[0].file_version, "brain.Event:2");
  EXPECT_EQ((*records)[1].step, 3);
  EXPECT_DOUBLE_EQ((*records)[1].wall_time, 1000.5);
  ASSERT_EQ((*records)[1].scalars.size(), 3u);
  EXPECT_EQ((*records)[1].scalars[0].first, "mean_reward");
  EXPECT_FLOAT_EQ((*records)[1].scalars[0].second, 0.25f);
  EXPECT_FLOAT_EQ((*records)[1].scalars[1].second, -1.5f);
  EXPECT_TRUE((*records)[1].has_value[2]);  // a zero is written, not left out as a default
  EXPECT_EQ((*records)[1].scalars[2].second, 0.0f);
  EXPECT_TRUE((*records)[2].session_start);
  EXPECT_EQ((*records)[2].step, 2);
  (void)RemoveTree(dir);
}

// TFRecord's framing: the stored checksums are CRC-32C masked as TensorFlow masks them.
TEST(EventFileTest, TheFramingIsTfRecords) {
  const std::string dir = FreshDir("framing");
  auto w = EventFileWriter::Open(dir);
  ASSERT_TRUE(w.ok());
  const std::string path = w->path();
  ASSERT_TRUE(w->Flush().ok());
  auto bytes = ReadFileToString(path);
  ASSERT_TRUE(bytes.ok());
  ASSERT_GE(bytes->size(), 16u);
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>((*bytes)[i]);
  EXPECT_EQ(bytes->size(), 12 + len + 4);  // one record: the file version
  uint32_t stored = 0;
  for (int i = 11; i >= 8; --i) stored = (stored << 8) | static_cast<unsigned char>((*bytes)[i]);
  EXPECT_EQ(stored, MaskedCrc32c(bytes->data(), 8));
  // The mask of TensorFlow's crc32c.Mask: rotate right by 15, add 0xa282ead8.
  EXPECT_EQ(MaskedCrc32c("", 0), 0xa282ead8u);
  (void)RemoveTree(dir);
}

TEST(EventFileTest, DamageIsDataLossAndATruncatedTailIsNot) {
  const std::string dir = FreshDir("damage");
  std::string path;
  {
    auto w = EventFileWriter::Open(dir);
    ASSERT_TRUE(w.ok());
    path = w->path();
    ASSERT_TRUE(w->AddScalars(1, {{"a", 1}}).ok());
    ASSERT_TRUE(w->AddScalars(2, {{"a", 2}}).ok());
  }
  auto bytes = *ReadFileToString(path);
  // A writer still writing: the last record cut short is not yet there.
  ASSERT_TRUE(WriteFileAtomic(path, bytes.substr(0, bytes.size() - 3)).ok());
  auto cut = ReadEventFile(path);
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->size(), 2u);
  // A flipped bit inside a record is not.
  std::string flipped = bytes;
  flipped[bytes.size() - 8] ^= 0x04;
  ASSERT_TRUE(WriteFileAtomic(path, flipped).ok());
  auto bad = ReadEventFile(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("fails its checksum"), std::string::npos) << bad.status();
  (void)RemoveTree(dir);
}

TEST(RunMetricsTest, RecordsBecomeScalarsOfTheirPhasesRun) {
  nlohmann::json grpo = {{"phase", "grpo"},
                         {"step", 4},
                         {"mean_reward", 0.5},
                         {"filter", true},
                         {"note", "text is left out"},
                         {"staleness", {{"0", 12}, {"1", 3}}}};
  RecordScalars s = ScalarsOf(grpo);
  EXPECT_EQ(s.run, "grpo");
  EXPECT_EQ(s.step, 4);
  std::map<std::string, double> got(s.scalars.begin(), s.scalars.end());
  EXPECT_EQ(got,
            (std::map<std::string, double>{
                {"mean_reward", 0.5}, {"filter", 1}, {"staleness/0", 12}, {"staleness/1", 3}}));
  RecordScalars e =
      ScalarsOf({{"phase", "eval"}, {"tag", "after_rl"}, {"step", 9}, {"accuracy", 0.75}});
  EXPECT_EQ(e.run, "grpo");
  EXPECT_EQ(e.step, 9);
  ASSERT_EQ(e.scalars.size(), 1u);
  EXPECT_EQ(e.scalars[0].first, "eval/accuracy");
  EXPECT_EQ(ScalarsOf({{"phase", "warmup"}, {"step", 2}, {"loss", 1.0}}).run, "warmup");
  EXPECT_TRUE(ScalarsOf({{"phase", "summary"}, {"wall_seconds", 3.0}}).run.empty());
}

// A run writes metrics.jsonl and one event file per phase; a resume appends to the JSONL and its
// new grpo file starts with a session START at the first step it runs again.
TEST(RunMetricsTest, ANewRunAndItsResume) {
  const std::string dir = FreshDir("run");
  ASSERT_TRUE(MakeDirs(dir).ok());
  const std::string jsonl = dir + "/metrics.jsonl", tb = dir + "/tensorboard";
  {
    auto m = RunMetrics::Create(jsonl, tb);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE((*m)->Write({{"phase", "warmup"}, {"step", 1}, {"loss", 2.0}}).ok());
    for (int step = 1; step <= 3; ++step) {
      ASSERT_TRUE(
          (*m)->Write({{"phase", "grpo"}, {"step", step}, {"mean_reward", 0.1 * step}}).ok());
    }
  }
  ASSERT_EQ(EventFiles(tb + "/warmup").size(), 1u);
  ASSERT_EQ(EventFiles(tb + "/grpo").size(), 1u);
  auto first = ReadEventFile(EventFiles(tb + "/grpo")[0]);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->size(), 4u);  // the version, then steps 1..3
  EXPECT_EQ((*first)[3].step, 3);
  {
    auto m = RunMetrics::Resume(jsonl, tb, 3);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE((*m)->Write({{"phase", "resume"}, {"step", 2}}).ok());
    ASSERT_TRUE((*m)->Write({{"phase", "grpo"}, {"step", 3}, {"mean_reward", 0.9}}).ok());
  }
  const auto files = EventFiles(tb + "/grpo");
  ASSERT_EQ(files.size(), 2u);
  int starts = 0;
  for (const auto& f : files) {
    auto r = ReadEventFile(f);
    ASSERT_TRUE(r.ok());
    if (r->size() > 1 && (*r)[1].session_start) {
      ++starts;
      EXPECT_EQ((*r)[1].step, 3);
      ASSERT_EQ(r->size(), 3u);
      EXPECT_FLOAT_EQ((*r)[2].scalars[0].second, 0.9f);
    }
  }
  EXPECT_EQ(starts, 1);
  auto lines = ReadFileToString(jsonl);
  ASSERT_TRUE(lines.ok());
  EXPECT_EQ(std::count(lines->begin(), lines->end(), '\n'), 6);
  // A new run replaces the old event files.
  ASSERT_TRUE(RunMetrics::Create(jsonl, tb).ok());
  EXPECT_FALSE(PathExists(tb + "/grpo"));
  (void)RemoveTree(dir);
}

TEST(RunMetricsTest, AnUnwritableDirectoryIsAClearError) {
  auto m = RunMetrics::Create("/proc/gyre-no/metrics.jsonl", "");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("cannot write /proc/gyre-no/metrics.jsonl"),
            std::string::npos);
}

}  // namespace
}  // namespace gyre::observe

namespace gyre::observe {
namespace {

// Found by fuzz_run_files: fields of the wrong type in a damaged metrics file ("phase": 2.5) made
// the report throw; huge values made the float conversion undefined. Both are handled now.
TEST(RunMetricsTest, WrongTypesAndHugeValuesInRecordsAreTolerated) {
  const std::string jsonl =
      "{\"phase\":2.5,\"step\":1}\n"
      "{\"phase\":\"eval\",\"tag\":7,\"accuracy\":\"high\"}\n"
      "{\"phase\":\"grpo\",\"step\":1e300,\"generated_tokens\":\"x\",\"samples\":[1],"
      "\"staleness\":{\"0\":\"many\",\"1\":2},\"mean_reward\":1e308}\n"
      "{\"phase\":\"grpo\",\"step\":2,\"mean_reward\":-1e308}\n";
  auto charts = ChartsOfMetrics(jsonl);
  ASSERT_TRUE(charts.ok()) << charts.status();
  for (const auto& c : *charts) {
    const std::string svg = RenderSvgChart(c);
    EXPECT_NE(svg.find("</svg>"), std::string::npos) << c.title;
  }
  EXPECT_TRUE(ScalarsOf({{"phase", 2.5}}).run.empty());
  EXPECT_EQ(ScalarsOf({{"phase", "grpo"}, {"step", 1e300}, {"x", 1}}).step, 0);
  const std::string dir = ::testing::TempDir() + "/observe_huge_" + std::to_string(getpid());
  (void)RemoveTree(dir);
  auto w = EventFileWriter::Open(dir);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->AddScalars(1, {{"big", 1e308}, {"small", -1e308}}).ok());
  ASSERT_TRUE(w->Flush().ok());
  auto records = ReadEventFile(w->path());
  ASSERT_TRUE(records.ok());
  EXPECT_TRUE(std::isinf((*records)[1].scalars[0].second) && (*records)[1].scalars[0].second > 0);
  EXPECT_TRUE(std::isinf((*records)[1].scalars[1].second) && (*records)[1].scalars[1].second < 0);
  (void)RemoveTree(dir);
}

}  // namespace
}  // namespace gyre::observe
