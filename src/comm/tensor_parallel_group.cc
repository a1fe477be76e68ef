#include "comm/tensor_parallel_group.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "comm/device_weights.h"
#include "common/check.h"
#include "common/clock.h"

namespace gyre::comm {
namespace {

DataType TypeOf(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DataType::kFloat32;
    case at::kDouble:
      return DataType::kFloat64;
    case at::kBFloat16:
      return DataType::kBFloat16;
    case at::kHalf:
      return DataType::kFloat16;
    default:
      throw std::runtime_error(std::string("tensor parallelism cannot exchange ") +
                               c10::toString(t.scalar_type()) + " tensors");
  }
}

void ThrowIfFailed(const Status& s, const char* what) {
  if (!s.ok())
    throw std::runtime_error(std::string("tensor-parallel ") + what + ": " + s.message());
}

}  // namespace

bool CommTensorParallel::ThroughHost(const at::Tensor& t) const {
  return t.defined() && t.is_cuda() && comm_->backend() != "nccl";
}

void CommTensorParallel::DeviceReady(const at::Tensor& t, const char* what) const {
  // NCCL runs on its own stream, which does not wait for the kernels that made `t`.
  if (!t.defined() || !t.is_cuda() || comm_->backend() != "nccl") return;
  ThrowIfFailed(SynchronizeDevice(t.device().index(), DeadlineAfter(timeout_s_)), what);
}

void CommTensorParallel::AllReduceSum(at::Tensor& t) {
  GYRE_CHECK(t.is_contiguous()) << "tensor-parallel all-reduce of a strided tensor";
  if (ThroughHost(t)) {
    at::Tensor host = t.cpu();
    AllReduceSum(host);
    t.copy_(host);
    return;
  }
  DeviceReady(t, "all-reduce");
  const auto t0 = SteadyClock::now();
  const Status s = comm_->AllReduceSum(t.data_ptr(), static_cast<size_t>(t.numel()), TypeOf(t),
                                       DeadlineAfter(timeout_s_));
  seconds_ += SecondsSince(t0);
  ThrowIfFailed(s, "all-reduce");
}

at::Tensor CommTensorParallel::AllGather(const at::Tensor& t) {
  if (ThroughHost(t)) return AllGather(t.cpu()).to(t.device());
  const at::Tensor in = t.contiguous();
  DeviceReady(in, "all-gather");
  std::vector<int64_t> shape = {size()};
  for (int64_t d : in.sizes()) shape.push_back(d);
  at::Tensor out = at::empty(shape, in.options());
  const auto t0 = SteadyClock::now();
  const Status s = comm_->AllGather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()),
                                    TypeOf(in), DeadlineAfter(timeout_s_));
  seconds_ += SecondsSince(t0);
  ThrowIfFailed(s, "all-gather");
  return out;
}

void CommTensorParallel::Broadcast(at::Tensor& t, int root, double timeout_s) {
  GYRE_CHECK(t.is_contiguous()) << "tensor-parallel broadcast of a strided tensor";
  if (ThroughHost(t)) {
    at::Tensor host = t.cpu();
    Broadcast(host, root, timeout_s);
    if (root != rank()) t.copy_(host);
    return;
  }
  DeviceReady(t, "broadcast");
  const auto t0 = SteadyClock::now();
  const Status s = comm_->Broadcast(t.data_ptr(), static_cast<size_t>(t.nbytes()), root,
                                    DeadlineAfter(timeout_s > 0 ? timeout_s : timeout_s_));
  seconds_ += SecondsSince(t0);
  ThrowIfFailed(s, "broadcast");
  if (root != rank()) received_bytes_ += static_cast<uint64_t>(t.nbytes());
}

void CommTensorParallel::Scatter(const at::Tensor& parts, at::Tensor& out, int root) {
  GYRE_CHECK(out.is_contiguous()) << "tensor-parallel scatter into a strided tensor";
  if (ThroughHost(out) || ThroughHost(parts)) {
    at::Tensor host = at::empty(out.sizes(), out.options().device(at::kCPU));
    Scatter(parts.defined() ? parts.cpu() : parts, host, root);
    out.copy_(host);
    return;
  }
  DeviceReady(parts, "scatter");
  DeviceReady(out, "scatter");  // kernels still reading out's memory
  const void* input = nullptr;
  if (rank() == root) {
    GYRE_CHECK(parts.is_contiguous() && parts.dim() == out.dim() + 1 && parts.size(0) == size() &&
               parts.scalar_type() == out.scalar_type() && parts.numel() == out.numel() * size())
        << "tensor-parallel scatter of " << parts.sizes() << " " << parts.scalar_type() << " into "
        << out.sizes() << " " << out.scalar_type() << " over " << size() << " ranks";
    input = parts.data_ptr();
  }
  const auto t0 = SteadyClock::now();
  const Status s = comm_->Scatter(input, out.data_ptr(), static_cast<size_t>(out.nbytes()), root,
                                  DeadlineAfter(timeout_s_));
  seconds_ += SecondsSince(t0);
  ThrowIfFailed(s, "scatter");
  if (root != rank()) received_bytes_ += static_cast<uint64_t>(out.nbytes());
}

}  // namespace gyre::comm
