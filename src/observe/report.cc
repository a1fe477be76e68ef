#include "observe/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/file_util.h"

namespace gyre::observe {

namespace {

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Num(double v, int digits = 4) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
  return buf;
}

// Tick values covering [lo, hi] at a 1, 2 or 5 times a power of ten spacing, about `want` of them.
std::vector<double> NiceTicks(double lo, double hi, int want) {
  const double span = hi - lo;
  if (!std::isfinite(span) || !(span > 0)) return {lo, hi};
  const double raw = span / std::max(1, want);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  }
  std::vector<double> ticks;
  // By index, not by adding: with values far larger than their spread, t + step == t.
  const double first = std::ceil(lo / step - 1e-9);
  for (int i = 0; i < 4 * want + 4; ++i) {
    const double t = (first + i) * step;
    if (!std::isfinite(t) || t > hi + step * 1e-9) break;
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

// A record's field when it has the expected type, else the default: metrics files are read
// back, and a damaged one must not throw out of the report.
std::string StrField(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
double NumField(const nlohmann::json& j, const char* key, double fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

}  // namespace

std::string RenderSvgChart(const Chart& chart, int width, int height) {
  const double left = 64, right = 16, top = 34, bottom = 44;
  const double pw = width - left - right, ph = height - top - bottom;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const auto& s : chart.series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x);
      y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  }
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << " " << height << "\" role=\"img\" aria-label=\""
    << Escape(chart.title) << "\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  o << "<text x=\"" << left << "\" y=\"20\" font-size=\"15\" font-weight=\"600\" fill=\"#222\">"
    << Escape(chart.title) << "</text>\n";
  if (!(x0 <= x1)) {
    o << "<text x=\"" << width / 2 << "\" y=\"" << height / 2
      << "\" text-anchor=\"middle\" fill=\"#888\">no data</text>\n</svg>\n";
    return o.str();
  }
  if (x1 == x0) x0 -= 1, x1 += 1;
  if (y1 == y0) {
    const double pad = std::max(std::abs(y0) * 0.1, 1e-3);
    y0 -= pad, y1 += pad;
  } else {
    const double pad = (y1 - y0) * 0.05;
    y0 -= pad, y1 += pad;
  }
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return top + ph - (y - y0) / (y1 - y0) * ph; };
  // Grid, ticks, axes.
  o << "<g font-size=\"11\" fill=\"#555\">\n";
  for (double t : NiceTicks(y0, y1, 5)) {
    o << "<line x1=\"" << left << "\" x2=\"" << left + pw << "\" y1=\"" << Num(py(t), 6)
      << "\" y2=\"" << Num(py(t), 6) << "\" stroke=\"#e4e4e4\"/>";
    o << "<text x=\"" << left - 6 << "\" y=\"" << Num(py(t) + 4, 6) << "\" text-anchor=\"end\">"
      << Num(t, 6) << "</text>\n";
  }
  for (double t : NiceTicks(x0, x1, 6)) {
    o << "<line x1=\"" << Num(px(t), 6) << "\" x2=\"" << Num(px(t), 6) << "\" y1=\"" << top
      << "\" y2=\"" << top + ph << "\" stroke=\"#f0f0f0\"/>";
    o << "<text x=\"" << Num(px(t), 6) << "\" y=\"" << top + ph + 16 << "\" text-anchor=\"middle\">"
      << Num(t) << "</text>\n";
  }
  o << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"#999\"/>\n";
  o << "<text x=\"" << left + pw / 2 << "\" y=\"" << height - 8 << "\" text-anchor=\"middle\">"
    << Escape(chart.x_label) << "</text>\n";
  if (!chart.y_label.empty()) {
    o << "<text transform=\"translate(14 " << top + ph / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << Escape(chart.y_label) << "</text>\n";
  }
  o << "</g>\n";
  // Series and legend.
  double legend_x = left + pw;
  for (size_t i = chart.series.size(); i-- > 0;) {
    const Series& s = chart.series[i];
    legend_x -= 14 + 7.0 * static_cast<double>(s.name.size()) + 12;
    o << "<g font-size=\"11\"><rect x=\"" << Num(legend_x, 6) << "\" y=\"" << top - 12
      << "\" width=\"10\" height=\"3\" fill=\"" << s.color << "\"/><text x=\""
      << Num(legend_x + 14, 6) << "\" y=\"" << top - 8 << "\" fill=\"#333\">" << Escape(s.name)
      << "</text></g>\n";
  }
  for (const Series& s : chart.series) {
    std::ostringstream path;
    bool pen_down = false;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) {
        pen_down = false;  // a gap, not a line through a non-finite value
        continue;
      }
      path << (pen_down ? " L" : " M") << Num(px(x), 6) << " " << Num(py(y), 6);
      pen_down = true;
    }
    if (!s.markers && s.points.size() > 1) {
      o << "<path d=\"" << path.str() << "\" fill=\"none\" stroke=\"" << s.color
        << "\" stroke-width=\"1.6\" stroke-linejoin=\"round\"/>\n";
    }
    // Points: markers for sparse series; otherwise small invisible targets carrying tooltips.
    const bool show = s.markers || s.points.size() == 1;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      o << "<circle cx=\"" << Num(px(x), 6) << "\" cy=\"" << Num(py(y), 6) << "\" r=\""
        << (show ? 3.5 : 2.5) << "\" fill=\"" << (show ? s.color : "transparent") << "\"><title>"
        << Escape(s.name) << ": step " << Num(x, 8) << ", " << Num(y, 6) << "</title></circle>\n";
    }
  }
  o << "</svg>\n";
  return o.str();
}

StatusOr<std::vector<Chart>> ChartsOfMetrics(const std::string& jsonl) {
  std::map<std::string, std::vector<std::pair<double, double>>> grpo, warmup;
  std::vector<std::pair<double, double>> eval;
  std::istringstream in(jsonl);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return DataLoss("metrics line " + std::to_string(line_no) + " is not a JSON object");
    }
    const std::string phase = StrField(j, "phase");
    const double step = NumField(j, "step", 0);
    if (phase == "resume") {
      // The resumed run redoes the steps after its checkpoint: drop what came after it.
      for (auto* m : {&grpo}) {
        for (auto& [k, pts] : *m) {
          pts.erase(
              std::remove_if(pts.begin(), pts.end(), [&](const auto& p) { return p.first > step; }),
              pts.end());
        }
      }
      eval.erase(
          std::remove_if(eval.begin(), eval.end(), [&](const auto& p) { return p.first > step; }),
          eval.end());
      continue;
    }
    if (phase == "eval") {
      double at = step;
      if (!j.contains("step")) {
        // Runs from before eval records carried their step: it is in the tag.
        const std::string tag = StrField(j, "tag");
        at = tag.rfind("step_", 0) == 0                          ? std::atof(tag.c_str() + 5)
             : tag == "after_rl" && !grpo["mean_reward"].empty() ? grpo["mean_reward"].back().first
                                                                 : 0.0;
      }
      if (j.contains("accuracy") && j["accuracy"].is_number()) {
        eval.emplace_back(at, j["accuracy"].get<double>());
      }
      continue;
    }
    auto* into = phase == "grpo" ? &grpo : phase == "warmup" ? &warmup : nullptr;
    if (into == nullptr) continue;
    for (const auto& [k, v] : j.items()) {
      if (v.is_number()) (*into)[k].emplace_back(step, v.get<double>());
    }
    if (phase == "grpo") {
      // Derived: mean response length, mean staleness.
      const double gen = NumField(j, "generated_tokens", 0.0);
      const double n = NumField(j, "samples_generated", NumField(j, "samples", 0.0));
      if (n > 0) grpo["response_tokens"].emplace_back(step, gen / n);
      if (j.contains("staleness") && j["staleness"].is_object() && !j["staleness"].empty()) {
        double sum = 0, count = 0;
        for (const auto& [st, c] : j["staleness"].items()) {
          if (!c.is_number()) continue;
          sum += std::atof(st.c_str()) * c.get<double>();
          count += c.get<double>();
        }
        if (count > 0) grpo["staleness_mean"].emplace_back(step, sum / count);
      }
    }
  }
  std::vector<Chart> charts;
  auto add = [&](const std::string& title, const std::string& y_label,
                 std::vector<std::pair<std::string, std::string>> keys, const std::string& x_label,
                 const std::map<std::string, std::vector<std::pair<double, double>>>& from) {
    Chart c;
    c.title = title;
    c.y_label = y_label;
    c.x_label = x_label;
    static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = from.find(keys[i].first);
      if (it == from.end() || it->second.empty()) continue;
      c.series.push_back({keys[i].second, kColors[i % 5], it->second, false});
    }
    if (!c.series.empty()) charts.push_back(std::move(c));
  };
  add("Reward", "mean reward", {{"mean_reward", "mean reward"}}, "GRPO step", grpo);
  {
    Chart c;
    c.title = "Accuracy";
    c.y_label = "fraction correct";
    if (grpo.count("accuracy"))
      c.series.push_back({"training samples", "#1f77b4", grpo["accuracy"]});
    if (!eval.empty()) c.series.push_back({"held-out (greedy)", "#d62728", eval, true});
    if (!c.series.empty()) charts.push_back(std::move(c));
  }
  add("Response length", "tokens per sample", {{"response_tokens", "mean"}}, "GRPO step", grpo);
  add("KL", "nats", {{"approx_kl", "to the old policy"}, {"kl_reward", "to the reference"}},
      "GRPO step", grpo);
  add("Entropy", "nats per token", {{"entropy", "entropy"}}, "GRPO step", grpo);
  add("Clip fraction", "fraction of tokens", {{"clip_frac", "clipped"}}, "GRPO step", grpo);
  add("Generation throughput", "tokens / s", {{"tokens_per_s", "generated"}}, "GRPO step", grpo);
  add("Phase timings", "seconds",
      {{"step_time_s", "step"},
       {"generate_s", "generate"},
       {"train_s", "train"},
       {"publish_s", "weight sync"}},
      "GRPO step", grpo);
  add("Staleness", "policy versions", {{"staleness_mean", "mean of trained samples"}}, "GRPO step",
      grpo);
  add("Rollout-trainer mismatch", "", {{"mismatch_abs_logprob", "mean |log-prob difference|"}},
      "GRPO step", grpo);
  add("Warm-up loss", "loss", {{"loss", "loss"}}, "warm-up step", warmup);
  return charts;
}

StatusOr<std::string> RenderRunReport(const std::string& run_dir) {
  const std::string metrics_path = run_dir + "/metrics.jsonl";
  if (!PathExists(metrics_path)) {
    return NotFound(run_dir + " has no metrics.jsonl: give a run directory (job.output_dir/" +
                    "job.name, e.g. runs/quickstart)");
  }
  GYRE_ASSIGN_OR_RETURN(std::string jsonl, ReadFileToString(metrics_path));
  auto charts = ChartsOfMetrics(jsonl);
  if (!charts.ok()) return charts.status().WithContext(metrics_path);
  std::string name = run_dir;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  name = name.substr(name.rfind('/') + 1);
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>Gyre run "
    << Escape(name) << "</title>\n<style>body{font-family:system-ui,sans-serif;margin:24px;"
    << "color:#222;background:#fafafa}h1{font-size:22px}.grid{display:flex;flex-wrap:wrap;"
    << "gap:16px}.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:6px}"
    << "table{border-collapse:collapse;margin-bottom:16px}td{padding:2px 12px 2px 0}"
    << "</style></head><body>\n<h1>Gyre run " << Escape(name) << "</h1>\n";
  if (PathExists(run_dir + "/summary.json")) {
    auto text = ReadFileToString(run_dir + "/summary.json");
    nlohmann::json s = text.ok() ? nlohmann::json::parse(*text, nullptr, false) : nlohmann::json();
    if (s.is_object()) {
      o << "<table>\n";
      for (const auto& [k, v] : s.items()) {
        o << "<tr><td>" << Escape(k) << "</td><td>"
          << Escape(v.is_number_float() ? Num(v.get<double>(), 6) : v.dump()) << "</td></tr>\n";
      }
      o << "</table>\n";
    }
  }
  if (charts->empty()) o << "<p>No GRPO or warm-up steps recorded yet.</p>\n";
  o << "<div class=\"grid\">\n";
  for (const Chart& c : *charts) o << "<div class=\"card\">" << RenderSvgChart(c) << "</div>\n";
  o << "</div>\n<p style=\"color:#888;font-size:12px\">from " << Escape(metrics_path)
    << "</p>\n</body></html>\n";
  return o.str();
}

}  // namespace gyre::observe
