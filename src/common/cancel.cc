#include "gyre/cancel.h"

namespace gyre {

void CancellationToken::Cancel(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_.load(std::memory_order_relaxed)) return;
  reason_ = reason.empty() ? "cancelled by the caller" : reason;
  cancelled_.store(true, std::memory_order_release);
}

std::string CancellationToken::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

}  // namespace gyre
