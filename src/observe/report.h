#pragma once
// `gyre report RUN_DIR`: a run's curves as one self-contained HTML page of SVG charts (no
// scripts, no external files), from RUN_DIR/metrics.jsonl (docs/observability.md#report).
//
// Thread contract: plain functions of their arguments.

#include <string>
#include <utility>
#include <vector>

#include "gyre/status.h"

namespace gyre::observe {

struct Series {
  std::string name;
  std::string color;                              // CSS colour
  std::vector<std::pair<double, double>> points;  // (x, y), x ascending
  bool markers = false;                           // draw each point (sparse series: evals)
};

struct Chart {
  std::string title;
  std::string x_label = "GRPO step";
  std::string y_label;
  std::vector<Series> series;
};

// One chart as an SVG element (width x height pixels), with axes, ticks, a legend and a
// tooltip per point. A chart without points says so.
std::string RenderSvgChart(const Chart& chart, int width = 560, int height = 300);

// The charts of a run's metrics.jsonl text: reward, accuracy (training and held-out), response
// length, KL, entropy, clip fraction, tokens/s, phase timings, staleness, warm-up loss; a chart
// whose metric the run never recorded is left out. A line that is not JSON is a DataLoss error
// naming its line number.
StatusOr<std::vector<Chart>> ChartsOfMetrics(const std::string& jsonl);

// The whole page for RUN_DIR: its title, summary figures (summary.json if present) and charts.
StatusOr<std::string> RenderRunReport(const std::string& run_dir);

}  // namespace gyre::observe
