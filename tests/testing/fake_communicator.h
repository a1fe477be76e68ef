#pragma once
// FakeCommunicator: a data-parallel group simulated in one process. Every other member is taken
// to hold the same data as this one, so AllReduceSum multiplies float32/float64 data by size().
// It records each AllReduceSum (element count, type, calling thread) and lets a test make a
// chosen call fail, or run code at the start of every call.
//
// Thread-safety: every method may be called from any thread.

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/communicator.h"

namespace gyre::testing {

class FakeCommunicator final : public comm::Communicator {
 public:
  struct Call {
    size_t count = 0;
    comm::DataType type = comm::DataType::kFloat32;
    std::thread::id thread;
  };

  explicit FakeCommunicator(int size) : size_(size) {}

  int rank() const override { return 0; }
  int size() const override { return size_; }
  std::string backend() const override { return "fake"; }
  bool aborted() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }

  Status Broadcast(void*, size_t, int, comm::Deadline) override { return Status::Ok(); }
  Status Barrier(comm::Deadline) override { return Status::Ok(); }
  // The gradient-reduction tests that use this fake run unsharded; the sharded trainer's
  // collectives are tested over real Gloo groups.
  Status ReduceScatterSum(const void*, void*, size_t, comm::DataType, comm::Deadline) override {
    return FailedPrecondition("FakeCommunicator has no reduce-scatter");
  }
  Status AllGather(const void*, void*, size_t, comm::DataType, comm::Deadline) override {
    return FailedPrecondition("FakeCommunicator has no all-gather");
  }
  Status Scatter(const void*, void*, size_t, int, comm::Deadline) override {
    return FailedPrecondition("FakeCommunicator has no scatter");
  }
  void Abort() override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
  }

  Status AllReduceSum(void* data, size_t count, comm::DataType type,
                      comm::Deadline deadline) override {
    std::function<void(size_t)> hook;
    size_t index = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      index = calls_.size();
      calls_.push_back({count, type, std::this_thread::get_id()});
      hook = on_call_;
      if (aborted_) return Aborted("fake: communicator aborted");
      auto it = failures_.find(index);
      if (it != failures_.end()) {
        aborted_ = true;  // as a real communicator after a failed collective
        return it->second;
      }
    }
    if (hook) hook(index);
    if (comm::SecondsLeft(deadline) <= 0) return DeadlineExceeded("fake: deadline passed");
    for (size_t i = 0; i < count; ++i) {
      if (type == comm::DataType::kFloat32) static_cast<float*>(data)[i] *= size_;
      if (type == comm::DataType::kFloat64) static_cast<double*>(data)[i] *= size_;
    }
    return Status::Ok();
  }

  // AllReduceSum call number `index` (0-based, counting all calls) returns `status` and leaves the
  // data alone; the communicator is aborted from then on, until Reset().
  void FailCall(size_t index, Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    failures_[index] = std::move(status);
  }
  // Runs `fn(call index)` at the start of every later AllReduceSum, on the calling thread.
  void OnCall(std::function<void(size_t)> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    on_call_ = std::move(fn);
  }
  std::vector<Call> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  // Element counts of the calls so far.
  std::vector<size_t> counts() const {
    std::vector<size_t> out;
    for (const Call& c : calls()) out.push_back(c.count);
    return out;
  }
  // Forgets the calls, the failures and the abort.
  void Reset() {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.clear();
    failures_.clear();
    aborted_ = false;
  }

 private:
  const int size_;
  mutable std::mutex mu_;
  std::vector<Call> calls_;              // guarded by mu_
  std::map<size_t, Status> failures_;    // guarded by mu_
  std::function<void(size_t)> on_call_;  // guarded by mu_
  bool aborted_ = false;                 // guarded by mu_
};

}  // namespace gyre::testing
