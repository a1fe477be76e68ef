#pragma once
// GradReducer: sums the gradients of a fixed list of parameters over a data-parallel group, in
// buckets, so that every rank ends the step holding the same summed gradient.
//
// Buckets. The parameters are taken in reverse order (roughly the order in which autograd
// finishes their gradients: the output head first, the embedding last) and packed greedily into
// float32 buckets of at most `bucket_bytes`; a larger parameter is a bucket of its own. The layout
// is fixed at construction, so every rank issues the same collectives, with the same sizes, in
// the same order, on every step (PlanGradBuckets).
//
// Two modes, chosen at construction:
// - Blocking (overlap = false): Finish() packs and all-reduces each bucket in turn on the caller's
//   thread, after the backward passes.
// - Overlapped (overlap = true): each parameter gets a post-accumulate-grad hook. Arm() before the
//   step's last backward pass; from then on a hook marks its parameter ready once autograd has
//   accumulated the final gradient into it. When every parameter of a bucket is ready and every
//   earlier bucket has been handed over, the bucket goes to the reducer's one communication
//   thread, which packs it and all-reduces it while autograd computes the gradients of earlier
//   layers. Buckets are handed over strictly in bucket order, whatever order the hooks
//   fire in, so the order of collectives never depends on the autograd schedule.
//   Finish() then marks the parameters the armed backward did not reach (unused in this step, or
//   no backward at all on a rank with an empty shard): their accumulated gradient, or zeros, is
//   reduced too, so every rank joins every collective. It hands over the remaining buckets and
//   waits for all of them.
// In both modes the summed buffers are copied back into the gradients at the end of Finish(), on
// the caller's thread: a gradient is only read while autograd may still run, never written (as in
// PyTorch DDP without gradient_as_bucket_view).
// Earlier backward passes of the same step (un-armed) only accumulate locally, like DDP's no_sync.
//
// Errors: each collective has a deadline of `timeout_s` from when it starts. The first failed
// bucket's Status is returned by Finish(), naming the bucket; the buckets after it are not
// reduced (the communicator is aborted by then, see comm/communicator.h), so Finish() returns
// within about one deadline and never hangs. On an error no gradient is overwritten with a
// partial sum (the caller must fail the step).
//
// Thread-safety: construction, Arm(), Finish(), Cancel() and destruction happen on one thread
// (the trainer's), never during a backward pass. The hooks run on whichever thread autograd runs
// a parameter's AccumulateGrad on (the caller's for CPU tensors, a device thread for CUDA ones);
// they only take mu_ and post work. The communicator is used by the communication thread between
// the first hand-over and the end of Finish()/Cancel(), and not at all otherwise, so the caller
// may issue its own collectives outside that window: one issuer at a time, as the Communicator
// contract requires.

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "gyre/status.h"

namespace gyre::trainer {

// The bucket layout for parameters of `numels` elements: bucket b holds the parameter indices
// out[b], taken from the last parameter to the first; a bucket's float32 size is at most
// `bucket_bytes` unless it holds a single larger parameter. Every parameter is in exactly one
// bucket. bucket_bytes < 4 is treated as 4 (one element).
std::vector<std::vector<size_t>> PlanGradBuckets(const std::vector<int64_t>& numels,
                                                 int64_t bucket_bytes);

class GradReducer {
 public:
  // `params` are leaf tensors that require grad (their gradients may be of any floating dtype;
  // buckets are float32 in host memory, which is what the Gloo group sums). `names` name them in
  // error messages. `comm` (not owned) must outlive the reducer. With `overlap`, installs a
  // post-accumulate-grad hook on every parameter (aborts if one already has one) and starts the
  // communication thread; the destructor removes the hooks and joins the thread.
  GradReducer(std::vector<at::Tensor> params, std::vector<std::string> names,
              comm::Communicator* comm, int64_t bucket_bytes, double timeout_s, bool overlap);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  bool overlap() const { return overlap_; }
  // Parameter indices per bucket, in the order the buckets are reduced.
  const std::vector<std::vector<size_t>>& buckets() const { return bucket_params_; }

  // Overlapped mode: the next backward pass is the step's last; reduce buckets as they complete.
  // Blocking mode: no-op. Must not be called twice without Finish() or Cancel() in between.
  void Arm();
  // Reduces every bucket not reduced yet and waits for all of them; on return each parameter's
  // gradient is defined and holds the sum over ranks, or the first error is returned. Leaves the
  // reducer ready for the next step (un-armed). Call once per optimizer step, on every rank.
  Status Finish();
  // For a step abandoned after Arm() (an exception from backward): waits for the buckets already
  // handed over, reduces no others, and un-arms. No-op when not armed and nothing is in flight.
  void Cancel();

 private:
  class Hook;
  struct Bucket {
    std::vector<size_t> params;
    int64_t elems = 0;
    at::Tensor buffer;  // float32, host memory, `elems` long
  };

  // From a hook: parameter `index` has its final gradient `grad` for the armed backward.
  void OnGradReady(size_t index, const at::Tensor& grad);
  // Marks parameter `index` ready with `grad`; hands over newly complete buckets. Needs mu_.
  void MarkReadyLocked(size_t index, at::Tensor grad);
  // "gradient bucket 2 of 5 (...)", for error messages.
  std::string BucketName(size_t b) const;
  // Packs the given gradients (one per parameter of bucket `b`) into its buffer and sums the
  // buffer over ranks. Reads the gradients only.
  Status PackAndAllReduce(size_t b, const std::vector<at::Tensor>& grads);
  // Copies every bucket's summed buffer back into the gradients. Needs mu_ held and all buckets
  // done without error.
  Status UnpackAll();
  // Takes the first queued bucket and reduces it with mu_ released (or skips it after an error),
  // then counts it done. Needs mu_ held through `lock` and a non-empty queue.
  void ReduceNextLocked(std::unique_lock<std::mutex>* lock);
  void CommLoop();
  // Cancel() with mu_ held through `lock`.
  void CancelLocked(std::unique_lock<std::mutex>* lock);
  // Back to the start-of-step state. Needs mu_ and no bucket in flight.
  void ResetLocked();

  const std::vector<at::Tensor> params_;
  const std::vector<std::string> names_;
  comm::Communicator* const comm_;
  const double timeout_s_;
  const bool overlap_;
  std::vector<std::vector<size_t>> bucket_params_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // parameter index -> bucket index

  std::mutex mu_;
  std::condition_variable cv_;
  // All guarded by mu_.
  bool armed_ = false;
  bool stop_ = false;
  std::vector<at::Tensor> grads_;  // per parameter: its final gradient, once ready
  std::vector<bool> ready_;        // per parameter
  std::vector<size_t> missing_;    // per bucket: parameters not ready yet
  size_t next_handover_ = 0;       // buckets [0, next_handover_) were handed over
  std::deque<size_t> queue_;       // handed over, not yet started by the communication thread
  size_t done_ = 0;                // buckets the communication thread finished (or skipped)
  Status first_error_;             // of the first failed bucket
  std::thread comm_thread_;        // overlapped mode only
};

}  // namespace gyre::trainer
