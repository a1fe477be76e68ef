#include "observe/progress.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace gyre::observe {

namespace {

using Clock = std::chrono::steady_clock;

// Wraps the default logger's sinks: clears the live line before a log line and redraws it after.
class LiveLineSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  LiveLineSink(Progress* progress, std::vector<spdlog::sink_ptr> inner)
      : progress_(progress), inner_(std::move(inner)) {}
  const std::vector<spdlog::sink_ptr>& inner() const { return inner_; }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    progress_->BeforeLog();
    for (auto& s : inner_) {
      if (s->should_log(msg.level)) s->log(msg);
    }
    for (auto& s : inner_) s->flush();
    progress_->AfterLog();
  }
  void flush_() override {
    for (auto& s : inner_) s->flush();
  }

 private:
  Progress* progress_;
  std::vector<spdlog::sink_ptr> inner_;
};

int TerminalWidth(std::FILE* out) {
  winsize ws{};
  if (ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 20) return ws.ws_col;
  return 100;
}

}  // namespace

std::string FormatDuration(double seconds) {
  if (seconds < 0) seconds = 0;
  const long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%lds", s);
  }
  return buf;
}

Progress::Mode Progress::ChooseMode(bool enabled, std::FILE* out) {
  if (!enabled) return Mode::kOff;
  if (const char* env = std::getenv("GYRE_PROGRESS")) {
    if (std::strcmp(env, "plain") == 0) return Mode::kPlain;
    if (std::strcmp(env, "live") == 0) return Mode::kLive;
    if (std::strcmp(env, "off") == 0) return Mode::kOff;
  }
  const char* term = std::getenv("TERM");
  const bool dumb = term != nullptr && std::strcmp(term, "dumb") == 0;
  return isatty(fileno(out)) && !dumb ? Mode::kLive : Mode::kPlain;
}

Progress::Progress(Mode mode, std::FILE* out) : mode_(mode), out_(out) {
  status_since_ = last_plain_note_ = Clock::now();
  if (mode_ == Mode::kOff) return;
  if (mode_ == Mode::kLive) {
    auto logger = spdlog::default_logger();
    if (logger) {
      auto sink = std::make_shared<LiveLineSink>(this, logger->sinks());
      logger->sinks() = {sink};
      log_hook_ = std::shared_ptr<void>(nullptr,
                                        [logger, sink](void*) { logger->sinks() = sink->inner(); });
    }
  }
  ticker_ = std::thread([this] { Tick(); });
}

Progress::~Progress() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
  Clear();
  log_hook_.reset();
}

void Progress::Tick() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(500));
    if (stop_) break;
    if (mode_ == Mode::kLive) {
      if (!status_.empty() || !summary_.empty()) DrawLocked();
    } else if (!status_.empty()) {
      const auto now = Clock::now();
      const double on = std::chrono::duration<double>(now - status_since_).count();
      const double since_note = std::chrono::duration<double>(now - last_plain_note_).count();
      if (on >= 30 && since_note >= 30) {
        std::fprintf(out_, "... %s (%s so far)\n", status_.c_str(), FormatDuration(on).c_str());
        std::fflush(out_);
        last_plain_note_ = now;
      }
    }
  }
}

std::string Progress::LineLocked() const {
  std::string line = summary_;
  if (!status_.empty()) {
    const double on = std::chrono::duration<double>(Clock::now() - status_since_).count();
    if (!line.empty()) line += "  | ";
    line += status_ + " " + FormatDuration(on);
  }
  if (!eta_.empty()) line += "  | ETA " + eta_;
  return line;
}

void Progress::EraseLocked() {
  if (drawn_) {
    std::fputs("\r\033[K", out_);
    std::fflush(out_);
    drawn_ = false;
  }
}

void Progress::DrawLocked() {
  std::string line = LineLocked();
  const size_t width = static_cast<size_t>(TerminalWidth(out_) - 1);
  if (line.size() > width) line.resize(width);
  std::fprintf(out_, "\r\033[K%s", line.c_str());
  std::fflush(out_);
  drawn_ = !line.empty();
}

void Progress::Print(const std::string& line) {
  if (mode_ == Mode::kOff) return;
  std::lock_guard<std::mutex> lock(mu_);
  EraseLocked();
  std::fprintf(out_, "%s\n", line.c_str());
  if (mode_ == Mode::kLive) DrawLocked();
  std::fflush(out_);
}

void Progress::StepLine(const std::string& plain_line, const std::string& summary) {
  if (mode_ == Mode::kOff) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (mode_ == Mode::kPlain) {
    if (plain_line.empty()) return;
    std::fprintf(out_, "%s%s\n", plain_line.c_str(), eta_.empty() ? "" : ("  ETA " + eta_).c_str());
    std::fflush(out_);
    return;
  }
  summary_ = summary;
  DrawLocked();
}

void Progress::Status(const std::string& what) {
  if (mode_ == Mode::kOff) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (what != status_) {
    status_ = what;
    status_since_ = last_plain_note_ = Clock::now();
  }
  if (mode_ == Mode::kLive) DrawLocked();
}

void Progress::SetEta(const std::string& eta) {
  std::lock_guard<std::mutex> lock(mu_);
  eta_ = eta;
}

void Progress::Clear() {
  if (mode_ != Mode::kLive) return;
  std::lock_guard<std::mutex> lock(mu_);
  summary_.clear();
  status_.clear();
  eta_.clear();
  EraseLocked();
}

void Progress::BeforeLog() {
  mu_.lock();
  EraseLocked();
}

void Progress::AfterLog() {
  if (!status_.empty() || !summary_.empty()) DrawLocked();
  mu_.unlock();
}

}  // namespace gyre::observe
