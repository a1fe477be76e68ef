#include "comm/communicator.h"

namespace gyre::comm {

Deadline DeadlineAfter(double seconds) {
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
      return 2;
  }
  return 0;
}

}  // namespace gyre::comm
