#include "trainer/grad_reducer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "common/check.h"

namespace gyre::trainer {

std::vector<std::vector<size_t>> PlanGradBuckets(const std::vector<int64_t>& numels,
                                                 int64_t bucket_bytes) {
  const int64_t cap = std::max<int64_t>(1, bucket_bytes / 4);  // float32 elements
  std::vector<std::vector<size_t>> out;
  int64_t elems = 0;
  for (size_t k = numels.size(); k-- > 0;) {
    if (out.empty() || elems + numels[k] > cap) {
      out.emplace_back();
      elems = 0;
    }
    out.back().push_back(k);
    elems += numels[k];
  }
  return out;
}

// Runs after autograd accumulated a parameter's gradient (AccumulateGrad), on autograd's thread.
class GradReducer::Hook : public torch::autograd::PostAccumulateGradHook {
 public:
  Hook(GradReducer* reducer, size_t index) : reducer_(reducer), index_(index) {}
  void operator()(const torch::autograd::Variable& param) override {
    reducer_->OnGradReady(index_, param.grad());
  }

 private:
  GradReducer* const reducer_;
  const size_t index_;
};

GradReducer::GradReducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                         comm::Communicator* comm, int64_t bucket_bytes, double timeout_s,
                         bool overlap)
    : params_(std::move(params)),
      names_(std::move(names)),
      comm_(comm),
      timeout_s_(timeout_s),
      overlap_(overlap) {
  GYRE_CHECK(comm_ != nullptr);
  GYRE_CHECK(names_.size() == params_.size()) << names_.size() << " names for " << params_.size();
  std::vector<int64_t> numels;
  for (const auto& p : params_) numels.push_back(p.numel());
  bucket_params_ = PlanGradBuckets(numels, bucket_bytes);
  bucket_of_.resize(params_.size());
  for (size_t b = 0; b < bucket_params_.size(); ++b) {
    Bucket bucket;
    bucket.params = bucket_params_[b];
    for (size_t k : bucket.params) {
      bucket_of_[k] = b;
      bucket.elems += numels[k];
    }
    bucket.buffer = at::empty({bucket.elems}, at::TensorOptions().dtype(at::kFloat));
    buckets_.push_back(std::move(bucket));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ResetLocked();
  }
  if (overlap_) {
    for (size_t i = 0; i < params_.size(); ++i) {
      GYRE_CHECK(params_[i].requires_grad() && params_[i].is_leaf())
          << "'" << names_[i] << "' is not a leaf that requires grad";
      GYRE_CHECK(torch::autograd::impl::post_acc_grad_hooks(params_[i]) == nullptr)
          << "'" << names_[i] << "' already has a post-accumulate-grad hook";
      torch::autograd::impl::set_post_acc_grad_hooks(params_[i], std::make_unique<Hook>(this, i));
    }
    comm_thread_ = std::thread([this] { CommLoop(); });
  }
}

GradReducer::~GradReducer() {
  Cancel();
  if (overlap_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    comm_thread_.join();
    for (const auto& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  }
}

void GradReducer::Arm() {
  if (!overlap_) return;
  std::lock_guard<std::mutex> lock(mu_);
  GYRE_CHECK(!armed_ && next_handover_ == 0) << "Arm() twice in one step";
  armed_ = true;
}

void GradReducer::OnGradReady(size_t index, const at::Tensor& grad) {
  std::lock_guard<std::mutex> lock(mu_);
  // Earlier micro-batches of a step only accumulate. A gradient that is undefined (never the
  // case after AccumulateGrad) is left for Finish() to fill in.
  if (!armed_ || ready_[index] || !grad.defined()) return;
  MarkReadyLocked(index, grad);
}

void GradReducer::MarkReadyLocked(size_t index, at::Tensor grad) {
  ready_[index] = true;
  grads_[index] = std::move(grad);
  --missing_[bucket_of_[index]];
  bool handed_over = false;
  while (next_handover_ < buckets_.size() && missing_[next_handover_] == 0) {
    queue_.push_back(next_handover_++);
    handed_over = true;
  }
  if (handed_over) cv_.notify_all();
}

std::string GradReducer::BucketName(size_t b) const {
  const Bucket& bucket = buckets_[b];
  return "gradient bucket " + std::to_string(b + 1) + " of " + std::to_string(buckets_.size()) +
         " (" + std::to_string(bucket.params.size()) + " tensors from '" +
         names_[bucket.params.front()] + "', " + std::to_string(bucket.elems) + " floats)";
}

Status GradReducer::PackAndAllReduce(size_t b, const std::vector<at::Tensor>& grads) {
  Bucket& bucket = buckets_[b];
  try {
    at::NoGradGuard no_grad;
    int64_t off = 0;
    for (const at::Tensor& g : grads) {
      bucket.buffer.narrow(0, off, g.numel()).copy_(g.reshape({-1}));
      off += g.numel();
    }
  } catch (const std::exception& e) {
    return Internal(BucketName(b) + ": packing failed: " + e.what());
  }
  return comm_
      ->AllReduceSum(bucket.buffer.data_ptr<float>(), static_cast<size_t>(bucket.elems),
                     comm::DataType::kFloat32, comm::DeadlineAfter(timeout_s_))
      .WithContext(BucketName(b));
}

Status GradReducer::UnpackAll() {
  try {
    for (const Bucket& bucket : buckets_) {
      int64_t off = 0;
      for (size_t k : bucket.params) {
        const at::Tensor& g = grads_[k];  // the parameter's .grad itself
        g.copy_(bucket.buffer.narrow(0, off, g.numel()).view(g.sizes()));
        off += g.numel();
      }
    }
  } catch (const std::exception& e) {
    return Internal(std::string("unpacking summed gradients failed: ") + e.what());
  }
  return Status::Ok();
}

void GradReducer::ReduceNextLocked(std::unique_lock<std::mutex>* lock) {
  const size_t b = queue_.front();
  queue_.pop_front();
  // After a failure the group is aborted; the later buckets are not attempted.
  const bool skip = !first_error_.ok();
  std::vector<at::Tensor> grads;
  for (size_t k : buckets_[b].params) grads.push_back(grads_[k]);
  lock->unlock();
  Status s = skip ? Status::Ok() : PackAndAllReduce(b, grads);
  grads.clear();
  lock->lock();
  if (!s.ok() && first_error_.ok()) first_error_ = std::move(s);
  ++done_;
  cv_.notify_all();
}

void GradReducer::CommLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_
    ReduceNextLocked(&lock);
  }
}

Status GradReducer::Finish() {
  at::NoGradGuard no_grad;
  std::unique_lock<std::mutex> lock(mu_);
  // Backward has returned: what it did not reach is final as it is (accumulated by an earlier
  // micro-batch) or zero (unused on this rank in this step).
  armed_ = false;
  std::vector<size_t> unreached;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) unreached.push_back(i);
  }
  try {
    for (size_t i : unreached) {
      const at::Tensor& p = params_[i];
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    }
  } catch (const std::exception& e) {
    CancelLocked(&lock);
    return Internal(std::string("zero gradients for unused parameters: ") + e.what());
  }
  for (size_t i : unreached) MarkReadyLocked(i, params_[i].grad());
  GYRE_CHECK(next_handover_ == buckets_.size());
  // Blocking mode: the caller's thread is the only issuer.
  if (!overlap_) {
    while (!queue_.empty()) ReduceNextLocked(&lock);
  }
  cv_.wait(lock, [this] { return done_ == buckets_.size(); });
  // The communication thread is idle now. Gradients are written only here, after backward, never
  // while autograd may still be running.
  Status result = first_error_;
  if (result.ok()) result = UnpackAll();
  ResetLocked();
  return result;
}

void GradReducer::Cancel() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!armed_ && next_handover_ == 0) return;
  CancelLocked(&lock);
}

void GradReducer::CancelLocked(std::unique_lock<std::mutex>* lock) {
  armed_ = false;
  // Buckets still queued are skipped; the one being reduced finishes (bounded by its deadline).
  // In blocking mode nothing runs outside Finish() itself, so there is nothing to wait for.
  if (first_error_.ok()) first_error_ = Aborted("gradient reduction cancelled");
  if (overlap_) cv_.wait(*lock, [this] { return done_ == next_handover_; });
  ResetLocked();
}

void GradReducer::ResetLocked() {
  armed_ = false;
  grads_.assign(params_.size(), at::Tensor());
  ready_.assign(params_.size(), false);
  missing_.clear();
  for (const auto& b : buckets_) missing_.push_back(b.params.size());
  next_handover_ = 0;
  queue_.clear();
  done_ = 0;
  first_error_ = Status::Ok();
}

}  // namespace gyre::trainer
