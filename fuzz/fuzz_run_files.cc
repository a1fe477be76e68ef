// Fuzzes the readers of a run's own files that `gyre report` and the tests read back
// (src/observe): TensorBoard event files (observe::ReadEventFile: TFRecord framing, checksums,
// Event records) and metrics.jsonl (observe::ChartsOfMetrics), whose charts are then rendered
// (observe::RenderSvgChart: scales, ticks, non-finite values). Input: the first byte picks the
// reader; the rest is the file's bytes.
//
// Checks: every chart renders to one complete <svg> element.

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/check.h"
#include "common/logging.h"
#include "fuzz/fuzz_util.h"
#include "observe/event_file.h"
#include "observe/report.h"

namespace {

gyre::fuzz::MemFile* g_file = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gyre::InitLogging("fuzz", "off");
  g_file = new gyre::fuzz::MemFile("events.out.tfevents");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    g_file->Set(body.data(), body.size());
    auto records = gyre::observe::ReadEventFile(g_file->path());
    if (records.ok()) {
      for (const auto& r : *records) GYRE_CHECK(r.scalars.size() == r.has_value.size());
    }
    return 0;
  }
  auto charts = gyre::observe::ChartsOfMetrics(body);
  if (!charts.ok()) return 0;
  for (const auto& c : *charts) {
    const std::string svg = gyre::observe::RenderSvgChart(c);
    GYRE_CHECK(svg.rfind("<svg", 0) == 0 && svg.find("</svg>") != std::string::npos);
  }
  return 0;
}
