#pragma once
// Wall-clock intervals on the monotonic clock, for timeouts and timings.

#include <chrono>

namespace gyre {

using SteadyClock = std::chrono::steady_clock;

// Seconds from `t0` to now.
inline double SecondsSince(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

}  // namespace gyre
