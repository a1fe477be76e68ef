#pragma once
// SIGINT/SIGTERM during a job (gyre train, RunJob): the handlers only record the signal; the
// job checks InterruptReason() at its waiting points and stops cleanly (docs/reliability.md).
//
// Thread contract: SignalScope is created and destroyed on the job thread; InterruptReason may
// be called from any thread.

#include <signal.h>

#include <string>

namespace gyre::controller {

// Installs the handlers for its lifetime and restores the previous ones; clears any signal
// recorded before.
class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  struct sigaction old_int_ = {}, old_term_ = {};
};

// "interrupted by SIGINT" (or SIGTERM) once such a signal arrived, else "".
std::string InterruptReason();

}  // namespace gyre::controller
