#include "cli/report_command.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "common/command_line.h"
#include "common/file_util.h"
#include "common/subprocess.h"
#include "observe/report.h"

namespace gyre::cli {

namespace {

constexpr char kReportSummary[] =
    "Renders the curves of a run (RUN_DIR/metrics.jsonl: reward, accuracy with the held-out\n"
    "evaluations, response length, KL, entropy, clip fraction, tokens/s, phase timings,\n"
    "staleness, warm-up loss) as one self-contained HTML page of SVG charts.";

constexpr char kReportDetails[] =
    "Works on a run that is still going: it reads what metrics.jsonl holds now. --png needs\n"
    "headless Chromium: the `chromium` executable on PATH, or $GYRE_CHROMIUM.\n"
    "Exit status: 0, 1 when the run cannot be read or the page or screenshot cannot be\n"
    "written, 2 on a usage error.";

std::string FindChromium() {
  if (const char* env = std::getenv("GYRE_CHROMIUM")) return FindInPath(env);
  for (const char* name : {"chromium", "chromium-browser", "google-chrome", "chrome"}) {
    if (std::string found = FindInPath(name); !found.empty()) return found;
  }
  return "";
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "gyre report: %s\n", msg.c_str());
  return 1;
}

}  // namespace

int RunReport(const std::vector<std::string>& args) {
  std::string run_dir, out, png;
  int width = 1240;
  auto app = NewCommand("gyre report", kReportSummary, kReportDetails);
  app->add_option("RUN_DIR", run_dir, "the run directory")->required();
  app->add_option("--out", out, "where the page goes")
      ->type_name("FILE")
      ->default_str("RUN_DIR/report.html");
  app->add_option("--png", png, "also a PNG screenshot of the page, by headless Chromium")
      ->type_name("FILE");
  app->add_option("--width", width, "the screenshot's width in pixels, in [320, 99999]")
      ->type_name("PX")
      ->check(NumberIn(320, 99999));
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  auto page = observe::RenderRunReport(run_dir);
  if (!page.ok()) return Fail(page.status().message());
  if (out.empty()) out = run_dir + "/report.html";
  if (Status st = WriteFileAtomic(out, *page); !st.ok()) return Fail(st.message());
  std::printf("report: %s\n", out.c_str());
  if (png.empty()) return 0;
  const std::string chromium = FindChromium();
  if (chromium.empty()) {
    return Fail(
        "--png needs headless Chromium: install it (Debian: apt-get install chromium) or "
        "set GYRE_CHROMIUM to its executable (found none on PATH)");
  }
  // Tall enough for every chart: the summary, then rows of cards (each ~330 px, two to a row at
  // the default width).
  size_t charts = 0;
  for (size_t at = page->find("<svg"); at != std::string::npos; at = page->find("<svg", at + 1)) {
    ++charts;
  }
  const int per_row = std::max(1, (width - 40) / 590);
  const int rows = static_cast<int>((charts + per_row - 1) / per_row);
  const int height = 320 + 335 * std::max(1, rows);
  const std::string log = png + ".chromium.log";
  auto pid = SpawnProcess({chromium, "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", "--screenshot=" + AbsolutePath(png),
                           "--window-size=" + std::to_string(width) + "," + std::to_string(height),
                           "file://" + AbsolutePath(out)},
                          log);
  if (!pid.ok()) return Fail("cannot start " + chromium + ": " + pid.status().message());
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!PollExit(*pid, &status)) {
    if (std::chrono::steady_clock::now() > deadline) {
      TerminateProcess(*pid, 2);
      return Fail(chromium + " took over 60 s to take the screenshot (its output: " + log + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !PathExists(png)) {
    return Fail(chromium + " failed (" + DescribeWaitStatus(status) + "): " + LastErrorLine(log));
  }
  std::remove(log.c_str());
  std::printf("screenshot: %s\n", png.c_str());
  return 0;
}

}  // namespace gyre::cli
