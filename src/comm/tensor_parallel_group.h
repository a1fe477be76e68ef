#pragma once
// model::TensorParallelGroup (model/tensor_parallel.h) over a Communicator: the collectives of a
// tensor-parallel forward and backward, each with its own deadline. Tensors may live on a GPU:
// over NCCL they are exchanged in place once the device has finished making them; over Gloo
// (ranks that share a GPU, or a build without NCCL) through copies in host memory. They run inside
// autograd, so a failure throws std::runtime_error with the communicator's message; the caller (the
// trainer's step, the rollout engine's step) turns it into its Status.
//
// Thread-safety: as the communicator's (one thread issues collectives at a time).

#include <ATen/core/Tensor.h>

#include "comm/communicator.h"
#include "model/tensor_parallel.h"

namespace gyre::comm {

class CommTensorParallel : public model::TensorParallelGroup {
 public:
  // `comm` (not owned) must outlive the group's use, or the next Rebind.
  CommTensorParallel(Communicator* comm, double timeout_s) : comm_(comm), timeout_s_(timeout_s) {}
  // The same rank of a group formed again.
  void Rebind(Communicator* comm) { comm_ = comm; }
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  // float32, float64, bfloat16 and float16 tensors; any other dtype throws.
  void AllReduceSum(at::Tensor& t) override;
  at::Tensor AllGather(const at::Tensor& t) override;
  void Broadcast(at::Tensor& t, int root, double timeout_s = 0) override;
  void Scatter(const at::Tensor& parts, at::Tensor& out, int root) override;
  double seconds() const override { return seconds_; }
  uint64_t received_bytes() const override { return received_bytes_; }

 private:
  // A device tensor over a communicator that only reads host memory.
  bool ThroughHost(const at::Tensor& t) const;
  // Over NCCL: waits until the device has made `t` (throws on failure).
  void DeviceReady(const at::Tensor& t, const char* what) const;

  Communicator* comm_;
  double timeout_s_;
  double seconds_ = 0;  // in collectives
  uint64_t received_bytes_ = 0;
};

}  // namespace gyre::comm
