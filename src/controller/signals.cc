#include "controller/signals.h"

#include <atomic>

namespace gyre::controller {

namespace {

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal.store(sig); }

}  // namespace

SignalScope::SignalScope() {
  g_signal.store(0);
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
}

SignalScope::~SignalScope() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
}

std::string InterruptReason() {
  const int sig = g_signal.load();
  if (sig == 0) return "";
  return std::string("interrupted by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM");
}

}  // namespace gyre::controller
