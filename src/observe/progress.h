#pragma once
// Progress on a terminal (docs/observability.md#progress-on-a-terminal): one live status line,
// redrawn in place when stdout is a terminal, plain lines when it is piped.
//
//   Live (a TTY): Status() sets the line ("step 12/40 generating 3.1 s | reward 0.41 ...");
//   a ticker redraws it twice a second so its elapsed time moves; Print() writes a permanent
//   line above it; log lines (spdlog, on stderr) clear it first and it comes back after them.
//   Plain (piped, or GYRE_PROGRESS=plain): Status() prints nothing but, while one status stays
//   set for long (a model load, a weight sync, a checkpoint), a line every 30 s says so;
//   Print() and StepLine() print their lines.
//
// Thread contract: every method may be called from any thread.

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace gyre::observe {

class Progress {
 public:
  enum class Mode { kOff, kPlain, kLive };
  // kLive needs `out` to be a terminal; GYRE_PROGRESS=plain|live|off overrides the choice.
  static Mode ChooseMode(bool enabled, std::FILE* out);

  Progress(Mode mode, std::FILE* out);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  Mode mode() const { return mode_; }
  // A permanent line (both modes).
  void Print(const std::string& line);
  // A step's result: a permanent line when plain (none if `plain_line` is empty); in live mode
  // `summary` becomes the line's summary.
  void StepLine(const std::string& plain_line, const std::string& summary);
  // What the job does now ("generating", "waiting for 2 workers to load the model"); the line
  // shows how long it has been at it. Empty: nothing going on.
  void Status(const std::string& what);
  // The ETA shown after the summary ("ETA 3m10s"); empty for none.
  void SetEta(const std::string& eta);
  // Removes the live line (before the process prints its final lines).
  void Clear();

  // Called by the log sink around each log line (live mode).
  void BeforeLog();
  void AfterLog();

 private:
  void Tick();
  void DrawLocked();
  void EraseLocked();
  std::string LineLocked() const;

  const Mode mode_;
  std::FILE* out_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool drawn_ = false;
  std::string status_, summary_, eta_;
  std::chrono::steady_clock::time_point status_since_;
  std::chrono::steady_clock::time_point last_plain_note_;
  std::thread ticker_;
  std::shared_ptr<void> log_hook_;  // restores the logger's sinks when destroyed
};

// "3m10s", "1h05m", "42s".
std::string FormatDuration(double seconds);

}  // namespace gyre::observe
