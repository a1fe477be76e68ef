#pragma once
// GYRE_CHECK(cond) << "why": aborts the process with a message when an internal invariant is
// broken. For bugs only; bad input is reported with a Status. (Not named CHECK: c10 owns that.)

#include <cstdlib>
#include <iostream>
#include <sstream>

namespace gyre::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* cond) {
    stream_ << file << ":" << line << ": GYRE_CHECK failed: " << cond << " ";
  }
  [[noreturn]] ~CheckFailure() {
    std::cerr << stream_.str() << std::endl;
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace gyre::internal

#define GYRE_CHECK(cond)                 \
  (cond) ? (void)0                       \
         : ::gyre::internal::Voidify() & \
               ::gyre::internal::CheckFailure(__FILE__, __LINE__, #cond).stream()
