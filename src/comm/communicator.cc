#include "comm/communicator.h"

#include <cmath>

namespace gyre::comm {

Deadline DeadlineAfter(double seconds) {
  // A timeout can come from a request as any double; beyond about 292 years its conversion to
  // clock ticks would overflow (undefined behaviour). Cap it at about 31 years; NaN has expired.
  constexpr double kMaxSeconds = 1e9;
  if (std::isnan(seconds)) seconds = 0;
  seconds = std::fmin(std::fmax(seconds, -kMaxSeconds), kMaxSeconds);
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(seconds));
}

double SecondsLeft(Deadline deadline) {
  return std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
}

size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return 4;
    case DataType::kFloat64:
      return 8;
    case DataType::kBFloat16:
    case DataType::kFloat16:
      return 2;
  }
  return 0;
}

Status CheckScatterArguments(int rank, int size, const void* input, int root) {
  if (root < 0 || root >= size) {
    return InvalidArgument("scatter root " + std::to_string(root) + " outside a group of " +
                           std::to_string(size));
  }
  if (rank == root && input == nullptr) return InvalidArgument("scatter root without input");
  return Status::Ok();
}

}  // namespace gyre::comm
