#pragma once
// Communicator: a fixed group of `size` processes, each with a rank, that run collectives
// together (broadcast, sum all-reduce, sum reduce-scatter, all-gather, barrier). Implementations:
// Gloo over TCP on CPU memory (gloo_communicator.h) and NCCL on GPU memory (nccl_communicator.h).
// The weight plane (weight_broadcast.h) and the data-parallel trainer (trainer/policy_trainer.h,
// trainer/grad_reducer.h) use this interface only.
//
// Every call takes an absolute deadline. A call that cannot finish by then fails with
// kDeadlineExceeded and leaves the communicator aborted: a collective that timed out on one rank
// has left its peers in an unknown state, so the group must be formed again (a new rendezvous)
// before it is used. Abort() does the same on demand, from any thread, and makes a call that is
// waiting return kAborted promptly.
//
// Collectives must be called in the same order on every rank. Thread-safety: one thread issues
// collectives at a time; Abort(), rank(), size() and aborted() may be called from any thread.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "gyre/status.h"

namespace gyre::comm {

using Deadline = std::chrono::steady_clock::time_point;

// now + seconds (seconds <= 0 gives a deadline already passed).
Deadline DeadlineAfter(double seconds);
// Seconds left until `deadline`; negative once it has passed.
double SecondsLeft(Deadline deadline);

// Element types of the collectives.
enum class DataType { kFloat32, kFloat64, kBFloat16, kFloat16 };
size_t DataTypeSize(DataType t);

// The checks every Scatter implementation makes first: a root inside the group, and input on it.
Status CheckScatterArguments(int rank, int size, const void* input, int root);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "gloo" or "nccl".
  virtual std::string backend() const = 0;
  // True once a call timed out or failed in the transport, or Abort() was called.
  virtual bool aborted() const = 0;

  // Copies `bytes` bytes at `data` on rank `root` into `data` on every other rank. `data` is host
  // memory for Gloo. NCCL takes device memory directly and stages host memory through the device
  // (meant for small control messages: headers, manifests, acknowledgements).
  virtual Status Broadcast(void* data, size_t bytes, int root, Deadline deadline) = 0;
  // In place: every rank ends with the element-wise sum over ranks of `count` elements.
  virtual Status AllReduceSum(void* data, size_t count, DataType type, Deadline deadline) = 0;
  // `input` holds size() * `count` elements; rank r ends with the element-wise sum over ranks of
  // input elements [r * count, (r + 1) * count) in `output` (`count` elements, not overlapping
  // `input`). The sharded trainer's gradient reduction (ZeRO-2).
  virtual Status ReduceScatterSum(const void* input, void* output, size_t count, DataType type,
                                  Deadline deadline) = 0;
  // Every rank ends with rank r's `count` elements of `input` at output[r * count] (`output`
  // holds size() * `count` elements and does not overlap `input`). The sharded trainer's
  // exchange of updated weight slices.
  virtual Status AllGather(const void* input, void* output, size_t count, DataType type,
                           Deadline deadline) = 0;
  // Rank `root`'s `input` holds size() parts of `bytes` bytes; every rank, the root included, ends
  // with part r (its rank) in `output`, which does not overlap `input`. `input` is read only on the
  // root (the others may pass nullptr). The tensor-parallel rollout worker's weight slices.
  virtual Status Scatter(const void* input, void* output, size_t bytes, int root,
                         Deadline deadline) = 0;
  // Returns once every rank has entered the barrier.
  virtual Status Barrier(Deadline deadline) = 0;

  // Stops the communicator: the call in progress (if any) and every later call fail with
  // kAborted. Idempotent.
  virtual void Abort() = 0;
};

}  // namespace gyre::comm
