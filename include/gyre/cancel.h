#pragma once
// Cancellation that the caller owns: a job (RunJob) or another long call checks the token at its
// waiting points and stops cleanly, with the reason, once it is cancelled. Unlike process-wide
// signal handlers, a token cancels one call and nothing else in the program.
//
//   auto token = std::make_shared<gyre::CancellationToken>();
//   gyre::RunOptions opts;
//   opts.cancel = token;
//   std::thread job([&] { result = gyre::RunJob(cfg, opts); });
//   ...
//   token->Cancel("user pressed stop");   // RunJob returns Aborted("cancelled: user pressed stop")
//
// Thread contract: every method may be called from any thread at any time.

#include <atomic>
#include <mutex>
#include <string>

namespace gyre {

class CancellationToken {
 public:
  CancellationToken() = default;
  CancellationToken(const CancellationToken&) = delete;
  CancellationToken& operator=(const CancellationToken&) = delete;

  // Cancels; the first call's reason is kept, later calls change nothing.
  void Cancel(const std::string& reason = "cancelled by the caller");
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // The first Cancel's reason, or "" while not cancelled.
  std::string reason() const;

 private:
  mutable std::mutex mu_;
  std::string reason_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace gyre
