#pragma once
// Limits shared by the modules that enforce them and the config checks that must agree with them.

#include <cstdint>

namespace gyre {

// Largest message any Gyre RPC sends or accepts (a generate response or a weight bucket).
constexpr int64_t kMaxRpcMessageBytes = int64_t{512} << 20;

// Largest weight bucket the gRPC weight transport can carry: one bucket travels in one message,
// and the first also carries the manifest (names and shapes of every tensor), so 16 MiB of the
// message limit are kept for it and the framing.
constexpr int64_t kMaxGrpcWeightBucketBytes = kMaxRpcMessageBytes - (int64_t{16} << 20);

}  // namespace gyre
