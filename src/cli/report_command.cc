#include "cli/report_command.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "common/file_util.h"
#include "common/subprocess.h"
#include "observe/report.h"

namespace gyre::cli {

namespace {

constexpr char kHelp[] =
    "usage: gyre report RUN_DIR [--out FILE.html] [--png FILE.png] [--width PX]\n"
    "\n"
    "Renders the curves of a run (RUN_DIR/metrics.jsonl: reward, accuracy with the held-out\n"
    "evaluations, response length, KL, entropy, clip fraction, tokens/s, phase timings,\n"
    "staleness, warm-up loss) as one self-contained HTML page of SVG charts.\n"
    "\n"
    "  --out FILE    where the page goes (default RUN_DIR/report.html)\n"
    "  --png FILE    also a PNG screenshot of the page, taken by headless Chromium (the\n"
    "                `chromium` executable, or $GYRE_CHROMIUM)\n"
    "  --width PX    the screenshot's width (default 1240)\n"
    "\n"
    "Works on a run that is still going: it reads what metrics.jsonl holds now.\n";

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

int UsageError(const std::string& msg) {
  std::fprintf(stderr, "gyre report: %s (see gyre report --help)\n", msg.c_str());
  return 2;
}

}  // namespace

int RunReport(const std::vector<std::string>& args) {
  std::string run_dir, out, png;
  int width = 1240;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](std::string* v) {
      if (i + 1 >= args.size()) return false;
      *v = args[++i];
      return true;
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kHelp, stdout);
      return 0;
    } else if (a == "--out") {
      if (!value(&out)) return UsageError("--out needs a file name");
    } else if (a == "--png") {
      if (!value(&png)) return UsageError("--png needs a file name");
    } else if (a == "--width") {
      std::string w;
      if (!value(&w) || w.find_first_not_of("0123456789") != std::string::npos || w.empty() ||
          w.size() > 5 || std::stoi(w) < 320) {
        return UsageError("--width needs a number of pixels >= 320");
      }
      width = std::stoi(w);
    } else if (!a.empty() && a[0] == '-') {
      return UsageError("unknown option '" + a + "'");
    } else if (run_dir.empty()) {
      run_dir = a;
    } else {
      return UsageError("unexpected argument '" + a + "'");
    }
  }
  if (run_dir.empty()) {
    std::fputs(kHelp, stderr);
    return 2;
  }
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
