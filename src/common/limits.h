#pragma once
// Limits shared by the modules that enforce them and the config checks that must agree with them.

#include <unistd.h>

#include <cstdint>

namespace gyre {

// Largest message any Gyre RPC sends or accepts (a generate response or a weight bucket).
constexpr int64_t kMaxRpcMessageBytes = int64_t{512} << 20;

// Largest weight bucket the gRPC weight transport can carry: one bucket travels in one message,
// and the first also carries the manifest (names and shapes of every tensor), so 16 MiB of the
// message limit are kept for it and the framing.
constexpr int64_t kMaxGrpcWeightBucketBytes = kMaxRpcMessageBytes - (int64_t{16} << 20);

// This machine's physical memory in bytes (what a CPU model or KV cache must fit in).
inline double PhysicalMemoryBytes() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
}

}  // namespace gyre
