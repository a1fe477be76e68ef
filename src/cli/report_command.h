#pragma once
// `gyre report`: a run's curves as a self-contained HTML page (observe/report.h), optionally
// screenshotted to PNG by a headless Chromium.

#include <string>
#include <vector>

namespace gyre::cli {

// gyre report RUN_DIR [--out FILE.html] [--png FILE.png] [--width PX]
int RunReport(const std::vector<std::string>& args);

}  // namespace gyre::cli
