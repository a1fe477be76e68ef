// Watching a real job (docs/observability.md): its /metrics endpoint scraped while it trains and
// checked by promtool; its TensorBoard event files read back by TensorBoard's own reader after a
// kill -9 and a resume, equal to metrics.jsonl step for step; its live status line on a
// pseudo-terminal; and `gyre report` rendered by headless Chromium into a non-blank screenshot.

#include <gtest/gtest.h>
#include <pty.h>
#include <sys/wait.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "integration/run_util.h"
#include "test_paths.h"
#include "testing/dependency.h"
#include "testing/http_get.h"
#include "testing/png_read.h"

namespace gyre::testing {
namespace {

const std::string kQuickstart = std::string(GYRE_SOURCE_DIR) + "/configs/quickstart.yaml";

std::vector<std::string> SmallJob(const std::string& output_dir, int steps) {
  return {"train", kQuickstart,
          "--set", "job.output_dir=" + output_dir,
          "--set", "job.name=t",
          "--set", "trainer.warmup_sft_steps=5",
          "--set", "trainer.steps=" + std::to_string(steps),
          "--set", "rollout.prompts_per_step=8",
          "--set", "data.eval_size=20",
          "--set", "metrics.eval_every=2",
          "--set", kEveryGroupTrains};
}

// The value of an unlabelled sample `name` in a Prometheus scrape; NaN if absent.
double Sample(const std::string& scrape, const std::string& name) {
  std::istringstream in(scrape);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::atof(line.c_str() + name.size() + 1);
  }
  return NAN;
}

TEST(ObservabilityTest, MetricsReachPrometheusAndTensorBoardThroughAKillAndAResume) {
  const std::string dir = MakeTempDir("observe");
  std::vector<std::string> job = SmallJob(dir, 4);
  for (const char* kv : {"trainer.checkpoint_every=2", "metrics.endpoint=127.0.0.1:0"}) {
    job.push_back("--set");
    job.push_back(kv);
  }
  const std::string run = dir + "/t";
  const pid_t leader = StartGroupLeader(job, dir + "/first.out");
  // The endpoint, as the log announces it.
  std::string address;
  const std::regex announce("serving /metrics and /health on http://([0-9.]+:[0-9]+)");
  for (int i = 0; i < 1200 && address.empty(); ++i) {
    std::smatch m;
    const std::string out = ReadFile(dir + "/first.out");
    if (std::regex_search(out, m, announce)) address = m[1];
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(address.empty()) << ReadFile(dir + "/first.out");
  // Scraped while the job trains: once a GRPO step is done, its figures are there.
  HttpReply scrape;
  for (int i = 0; i < 1800; ++i) {
    scrape = HttpGet(address, "/metrics");
    if (scrape.code == 200 && Sample(scrape.body, "gyre_step") >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(scrape.code, 200);
  ASSERT_GE(Sample(scrape.body, "gyre_step"), 1) << scrape.body;
  EXPECT_EQ(Sample(scrape.body, "gyre_steps_planned"), 4);
  EXPECT_GT(Sample(scrape.body, "gyre_generated_tokens_total"), 0) << scrape.body;
  EXPECT_GT(Sample(scrape.body, "gyre_tokens_per_second"), 0) << scrape.body;
  EXPECT_FALSE(std::isnan(Sample(scrape.body, "gyre_mean_reward"))) << scrape.body;
  EXPECT_FALSE(std::isnan(Sample(scrape.body, "gyre_weight_sync_seconds"))) << scrape.body;
  EXPECT_NE(scrape.body.find("gyre_workers{role=\"rollout\",state=\"ready\"} 2"), std::string::npos)
      << scrape.body;
  EXPECT_NE(scrape.body.find("gyre_workers{role=\"trainer\",state=\"ready\"} 1"), std::string::npos)
      << scrape.body;
  int rc = 0;
  if (RunShell("command -v promtool", &rc), rc == 0) {
    const std::string path = dir + "/scrape.txt";
    std::ofstream(path) << scrape.body;
    const std::string out = RunShell("promtool check metrics < " + path, &rc);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_EQ(out, "") << out;
  } else {
    ADD_FAILURE() << "promtool is not installed (Debian package prometheus; tools/install-deps.sh)";
  }
  const HttpReply health = HttpGet(address, "/health");
  EXPECT_EQ(health.code, 200) << health.body;
  auto h = nlohmann::json::parse(health.body);
  EXPECT_EQ(h["status"], "ok");
  EXPECT_EQ(h["workers"]["rollout-1"], "ready");

  // Killed once step 3 is in the metrics (after the checkpoint of step 2), then resumed: the
  // resumed run redoes step 3, and TensorBoard must show each step once.
  const std::string metrics = run + "/metrics.jsonl";
  for (int i = 0; i < 3000; ++i) {
    if (IsDirectory(run + "/checkpoints/step-000002") &&
        MetricsRecords(metrics, "grpo").size() >= 3)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(::kill(-leader, SIGKILL), 0);
  int st = 0;
  ASSERT_EQ(::waitpid(leader, &st, 0), leader);
  job.push_back("--resume");
  auto resumed = GyreProcess::Start(job, dir);
  ASSERT_TRUE(resumed.Wait(600)) << resumed.Output();
  ASSERT_EQ(WEXITSTATUS(resumed.wait_status), 0) << resumed.Output();

  const std::string read =
      RunShell(std::string(GYRE_PYTHON) + " " + GYRE_SOURCE_DIR +
                   "/tests/integration/tensorboard_read.py " + run + "/tensorboard",
               &rc);
  if (rc == 77) GYRE_MISSING_DEPENDENCY(kFixPythonReferences) << read;
  ASSERT_EQ(rc, 0) << read;
  const auto tb = nlohmann::json::parse(read.substr(read.rfind("\n{") + 1));
  // Every number of every GRPO record is a scalar at its step, each step exactly once.
  const auto grpo = MetricsRecords(metrics, "grpo");
  ASSERT_EQ(grpo.size(), 4u);
  int compared = 0;
  for (const auto& [key, v] : grpo[0].items()) {
    if (!v.is_number() || key == "step") continue;
    ASSERT_TRUE(tb["grpo"].contains(key)) << key << " is not in TensorBoard: " << read;
    const auto& points = tb["grpo"][key];
    ASSERT_EQ(points.size(), 4u) << key << ": " << points.dump();
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(points[i][0].get<int>(), static_cast<int>(i + 1)) << key;
      const double want = grpo[i][key].get<double>(), got = points[i][1].get<double>();
      EXPECT_NEAR(got, want, 1e-6 * std::max(1.0, std::abs(want))) << key << " step " << i + 1;
      ++compared;
    }
  }
  EXPECT_GT(compared, 80);
  ASSERT_TRUE(tb["grpo"].contains("staleness/0")) << read;
  const auto& eval = tb["grpo"]["eval/accuracy"];
  ASSERT_EQ(eval.size(), 3u) << eval.dump();  // before RL, after step 2, after step 4
  const auto evals = MetricsRecords(metrics, "eval");
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(eval[i][0].get<int>(), static_cast<int>(2 * i));
    EXPECT_NEAR(eval[i][1].get<double>(), evals[i]["accuracy"].get<double>(), 1e-6);
  }
  ASSERT_EQ(tb["warmup"]["loss"].size(), 5u) << read;
  EXPECT_NEAR(tb["warmup"]["loss"][4][1].get<double>(),
              MetricsRecords(metrics, "warmup")[4]["loss"].get<double>(), 1e-5);
  (void)RemoveTree(dir);
}

// Runs `args` with stdout and stderr on a pseudo-terminal; returns everything written to it.
std::string RunOnTerminal(const std::vector<std::string>& args, int* wait_status) {
  std::vector<std::string> argv = {GYRE_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  int master = -1;
  winsize ws{};
  ws.ws_col = 160;
  ws.ws_row = 40;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, &ws);
  if (pid == 0) {
    ::setenv("TERM", "xterm", 1);
    ::unsetenv("GYRE_PROGRESS");
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(master, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(master);
  ::waitpid(pid, wait_status, 0);
  return out;
}

TEST(ObservabilityTest, ALiveStatusLineOnATerminalAndAReportThatRendersInChromium) {
  const std::string dir = MakeTempDir("observe_tty");
  int st = 0;
  const std::string tty = RunOnTerminal(SmallJob(dir, 3), &st);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << tty;
  // Redrawn in place: carriage return + erase line, the step's figures and an ETA; the per-step
  // plain lines are not printed on a terminal.
  EXPECT_NE(tty.find("\r\033[Kstep 1/3  reward"), std::string::npos) << tty;
  EXPECT_NE(tty.find("| ETA "), std::string::npos) << tty;
  EXPECT_NE(tty.find("starting 3 workers (each loads the model)"), std::string::npos) << tty;
  EXPECT_EQ(tty.find("step    1/3"), std::string::npos) << tty;
  EXPECT_NE(tty.find("eval after_rl"), std::string::npos) << tty;
  EXPECT_NE(tty.find("done: held-out accuracy"), std::string::npos) << tty;
  // Piped, the same job prints one plain line per step, with the ETA.
  auto piped = GyreProcess::Start(SmallJob(dir + "/piped", 2), dir);
  ASSERT_TRUE(piped.Wait(600));
  const std::string plain = piped.Output();
  EXPECT_EQ(plain.find("\033[K"), std::string::npos) << plain;
  EXPECT_NE(plain.find("step    1/2"), std::string::npos) << plain;
  EXPECT_NE(plain.find("ETA "), std::string::npos) << plain;

  // The report of the terminal run: an HTML page of SVG charts, screenshotted by Chromium.
  int rc = 0;
  if (RunShell("command -v chromium", &rc), rc != 0) {
    GYRE_MISSING_DEPENDENCY(kFixDebian) << "chromium (Debian package chromium) is not installed";
  }
  const std::string png = dir + "/report.png";
  const std::string out =
      RunShell(std::string(GYRE_BINARY) + " report " + dir + "/t --png " + png, &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::string html = ReadFile(dir + "/t/report.html");
  size_t charts = 0;
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1)) {
    ++charts;
  }
  EXPECT_GE(charts, 9u) << html.substr(0, 2000);
  for (const char* title : {">Reward<", ">Accuracy<", ">KL<", ">Entropy<", ">Clip fraction<",
                            ">Phase timings<", ">Staleness<", ">Warm-up loss<"}) {
    EXPECT_NE(html.find(title), std::string::npos) << title;
  }
  EXPECT_EQ(html.find("<script"), std::string::npos);  // self-contained, no scripts
  const Image img = DecodePng(ReadFile(png));
  ASSERT_TRUE(img.error.empty()) << img.error;
  EXPECT_EQ(img.width, 1240);
  // Not blank: a good share of the pixels are not the page's background, in many colours.
  size_t inked = 0;
  std::set<uint32_t> colours;
  const uint8_t* p = img.rgba.data();
  for (size_t i = 0; i < img.rgba.size(); i += 4) {
    const uint32_t c = (p[i] << 16) | (p[i + 1] << 8) | p[i + 2];
    colours.insert(c);
    if (p[i] < 200 || p[i + 1] < 200 || p[i + 2] < 200) ++inked;
  }
  const double fraction = static_cast<double>(inked) / (img.rgba.size() / 4);
  std::printf("report screenshot %dx%d: %.2f%% inked pixels, %zu colours\n", img.width, img.height,
              100 * fraction, colours.size());
  EXPECT_GT(fraction, 0.01);
  EXPECT_GT(colours.size(), 20u);
  (void)RemoveTree(dir);
}

}  // namespace
}  // namespace gyre::testing
