// NcclCommunicator: raw NCCL, non-blocking. Every call enqueues on the communicator's own
// stream, then polls (a) ncclCommGetAsyncError, which reports ncclInProgress while a
// non-blocking call is still being set up and an error code if the communicator failed, and
// (b) cudaStreamQuery, until the work is done. The poll yields for the first iterations (short
// collectives finish within microseconds) and then sleeps 50 us per round.

#include "comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace gyre::comm {
namespace {

std::string NcclError(ncclResult_t r) { return ncclGetErrorString(r); }
std::string CudaError(cudaError_t e) { return cudaGetErrorString(e); }

StatusOr<ncclDataType_t> ToNccl(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat16:
      return ncclFloat16;
  }
  return InvalidArgument("unknown data type");
}

// Calls `done()` until it returns true, yielding first, then sleeping briefly.
template <typename Fn>
void PollUntil(Fn done) {
  for (int i = 0; !done(); ++i) {
    if (i < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace

bool NcclCompiled() { return true; }

StatusOr<std::string> NewNcclUniqueId() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return Unavailable("ncclGetUniqueId: " + NcclError(r));
  return std::string(id.internal, sizeof(id.internal));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, int device, ncclComm_t comm, cudaStream_t stream,
                   void* scratch)
      : rank_(rank),
        size_(size),
        device_(device),
        comm_(comm),
        stream_(stream),
        scratch_(scratch) {}

  ~NcclCommunicator() override {
    std::lock_guard<std::mutex> lock(call_mu_);
    cudaSetDevice(device_);
    // Abort rather than destroy: it never waits on peers, and any work of ours is complete or
    // was already abandoned.
    AbortLocked();
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (staging_ != nullptr) cudaFree(staging_);
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  bool aborted() const override { return aborted_.load(); }

  Status Broadcast(void* data, size_t bytes, int root, Deadline deadline) override {
    if (root < 0 || root >= size_) {
      return InvalidArgument("broadcast root " + std::to_string(root) + " outside a group of " +
                             std::to_string(size_));
    }
    if (bytes == 0) return Status::Ok();
    cudaSetDevice(device_);  // before any runtime call: no stray context on another GPU
    if (!IsDeviceMemory(data)) {
      // The root's buffer is only read: no copy back (its callers may share it between threads).
      return RunStaged("broadcast", deadline, data, bytes, rank_ != root, [&](void* dev) {
        return ncclBroadcast(dev, dev, bytes, ncclUint8, root, comm_, stream_);
      });
    }
    return Run("broadcast", deadline,
               [&] { return ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_); });
  }

  Status AllReduceSum(void* data, size_t count, DataType type, Deadline deadline) override {
    GYRE_ASSIGN_OR_RETURN(ncclDataType_t t, ToNccl(type));
    if (count == 0) return Status::Ok();
    cudaSetDevice(device_);
    if (!IsDeviceMemory(data)) {
      return RunStaged(
          "all-reduce", deadline, data, count * DataTypeSize(type), true,
          [&](void* dev) { return ncclAllReduce(dev, dev, count, t, ncclSum, comm_, stream_); });
    }
    return Run("all-reduce", deadline,
               [&] { return ncclAllReduce(data, data, count, t, ncclSum, comm_, stream_); });
  }

  // Device memory goes to NCCL directly. Host memory is staged through the device like the other
  // collectives (one staging buffer holds input and output: the input first, the output after
  // it), which suits tests and small groups; the sharded trainer passes device tensors.
  Status ReduceScatterSum(const void* input, void* output, size_t count, DataType type,
                          Deadline deadline) override {
    GYRE_ASSIGN_OR_RETURN(ncclDataType_t t, ToNccl(type));
    if (count == 0) return Status::Ok();
    cudaSetDevice(device_);
    const size_t elem = DataTypeSize(type);
    if (!IsDeviceMemory(input) || !IsDeviceMemory(output)) {
      return RunStagedPair("reduce-scatter", deadline, input, count * size_ * elem, output,
                           count * elem, [&](const void* in, void* out) {
                             return ncclReduceScatter(in, out, count, t, ncclSum, comm_, stream_);
                           });
    }
    return Run("reduce-scatter", deadline,
               [&] { return ncclReduceScatter(input, output, count, t, ncclSum, comm_, stream_); });
  }

  Status AllGather(const void* input, void* output, size_t count, DataType type,
                   Deadline deadline) override {
    GYRE_ASSIGN_OR_RETURN(ncclDataType_t t, ToNccl(type));
    if (count == 0) return Status::Ok();
    cudaSetDevice(device_);
    const size_t elem = DataTypeSize(type);
    if (!IsDeviceMemory(input) || !IsDeviceMemory(output)) {
      return RunStagedPair("all-gather", deadline, input, count * elem, output,
                           count * size_ * elem, [&](const void* in, void* out) {
                             return ncclAllGather(in, out, count, t, comm_, stream_);
                           });
    }
    return Run("all-gather", deadline,
               [&] { return ncclAllGather(input, output, count, t, comm_, stream_); });
  }

  // NCCL has no scatter: the root sends each rank its part (and copies its own) in one group.
  Status Scatter(const void* input, void* output, size_t bytes, int root,
                 Deadline deadline) override {
    GYRE_RETURN_IF_ERROR(CheckScatterArguments(rank_, size_, input, root));
    if (bytes == 0) return Status::Ok();
    cudaSetDevice(device_);
    const bool root_here = rank_ == root;
    auto enqueue = [&](const void* in, void* out) -> ncclResult_t {
      if (root_here) {
        const auto* base = static_cast<const char*>(in);
        if (cudaMemcpyAsync(out, base + root * bytes, bytes, cudaMemcpyDeviceToDevice, stream_) !=
            cudaSuccess) {
          return ncclUnhandledCudaError;
        }
      }
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      for (int p = 0; root_here && p < size_; ++p) {
        if (p == root) continue;
        r = ncclSend(static_cast<const char*>(in) + p * bytes, bytes, ncclUint8, p, comm_, stream_);
        if (r != ncclSuccess) break;
      }
      if (!root_here) r = ncclRecv(out, bytes, ncclUint8, root, comm_, stream_);
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    };
    const size_t in_bytes = root_here ? bytes * size_ : 0;
    const bool on_device = IsDeviceMemory(output);
    if (root_here && IsDeviceMemory(input) != on_device) {
      return InvalidArgument("nccl scatter: input and output must both be host or device memory");
    }
    if (!on_device) {
      return RunStagedPair("scatter", deadline, input, in_bytes, output, bytes, enqueue);
    }
    return Run("scatter", deadline, [&] { return enqueue(input, output); });
  }

  // NCCL has no barrier: a one-element all-reduce on a scratch buffer serves as one.
  Status Barrier(Deadline deadline) override {
    return Run("barrier", deadline, [&] {
      return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_);
    });
  }

  void Abort() override {
    aborted_.store(true);
    // A call in progress sees the flag in its poll loop and aborts the communicator itself.
    std::unique_lock<std::mutex> lock(call_mu_, std::try_to_lock);
    if (lock.owns_lock()) AbortLocked();
  }

 private:
  template <typename EnqueueFn>
  Status Run(const char* what, Deadline deadline, EnqueueFn enqueue) {
    std::lock_guard<std::mutex> lock(call_mu_);
    const std::string name = std::string("nccl ") + what;
    if (aborted_.load() || comm_ == nullptr) return Aborted(name + ": communicator aborted");
    if (SecondsLeft(deadline) <= 0) {
      AbortLocked();
      return DeadlineExceeded(name + ": deadline passed before the call");
    }
    cudaError_t ce = cudaSetDevice(device_);
    if (ce != cudaSuccess) return Unavailable(name + ": cudaSetDevice: " + CudaError(ce));
    ncclResult_t r = enqueue();
    if (r != ncclSuccess && r != ncclInProgress) {
      AbortLocked();
      return Unavailable(name + ": " + NcclError(r));
    }
    // Phase 1: the (non-blocking) enqueue completes; phase 2: the stream drains.
    Status status;
    PollUntil([&] {
      if (aborted_.load()) {
        status = Aborted(name + " aborted");
        return true;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        status = DeadlineExceeded(name + " did not finish within its deadline");
        return true;
      }
      ncclResult_t async = ncclSuccess;
      ncclResult_t q = ncclCommGetAsyncError(comm_, &async);
      if (q != ncclSuccess) async = q;
      if (async == ncclInProgress) return false;
      if (async != ncclSuccess) {
        status = Unavailable(name + ": " + NcclError(async));
        return true;
      }
      const cudaError_t s = cudaStreamQuery(stream_);
      if (s == cudaErrorNotReady) return false;
      if (s != cudaSuccess) status = Unavailable(name + ": " + CudaError(s));
      return true;
    });
    if (!status.ok()) AbortLocked();
    return status;
  }

  // Host memory (pageable or pinned) is staged; device and managed memory go to NCCL directly.
  static bool IsDeviceMemory(const void* p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // an unknown pointer is host memory; clear the error slot
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }

  // A collective on host memory (the weight plane's headers, manifests and acknowledgements):
  // copied into pinned memory, then to a device staging buffer, run there, and copied back,
  // all on the communicator's stream so that the deadline poll covers every step (a pageable
  // copy would block the thread on an unfinished collective, out of the deadline's reach).
  template <typename EnqueueFn>
  Status RunStaged(const char* what, Deadline deadline, void* host, size_t bytes, bool copy_back,
                   EnqueueFn enqueue) {
    {
      std::lock_guard<std::mutex> lock(call_mu_);
      if (bytes > staged_bytes_) {
        cudaSetDevice(device_);
        if (pinned_ != nullptr) cudaFreeHost(pinned_);
        if (staging_ != nullptr) cudaFree(staging_);
        pinned_ = staging_ = nullptr;
        staged_bytes_ = 0;
        cudaError_t e = cudaMallocHost(&pinned_, bytes);
        if (e == cudaSuccess) e = cudaMalloc(&staging_, bytes);
        if (e != cudaSuccess) {
          return Unavailable(std::string("nccl ") + what + ": staging buffers: " + CudaError(e));
        }
        staged_bytes_ = bytes;
      }
      std::memcpy(pinned_, host, bytes);
    }
    GYRE_RETURN_IF_ERROR(Run(what, deadline, [&] {
      if (cudaMemcpyAsync(staging_, pinned_, bytes, cudaMemcpyHostToDevice, stream_) !=
          cudaSuccess) {
        return ncclUnhandledCudaError;
      }
      return enqueue(staging_);
    }));
    if (!copy_back) return Status::Ok();
    // The copy back is enqueued only after the collective completed: a non-blocking NCCL call
    // may still be enqueueing its own work when it returns.
    std::lock_guard<std::mutex> lock(call_mu_);
    const std::string name = std::string("nccl ") + what + " (copy back)";
    cudaError_t e = cudaMemcpyAsync(pinned_, staging_, bytes, cudaMemcpyDeviceToHost, stream_);
    if (e != cudaSuccess) return Unavailable(name + ": " + CudaError(e));
    Status status;
    PollUntil([&] {
      e = cudaStreamQuery(stream_);
      if (e == cudaErrorNotReady) {
        if (std::chrono::steady_clock::now() < deadline) return false;
        status = DeadlineExceeded(name + " did not finish within its deadline");
        return true;
      }
      if (e != cudaSuccess) status = Unavailable(name + ": " + CudaError(e));
      return true;
    });
    if (!status.ok()) {
      AbortLocked();
      return status;
    }
    std::memcpy(host, pinned_, bytes);
    return Status::Ok();
  }

  // A collective from `in_bytes` at host `input` to `out_bytes` at host `output`, through one
  // staging buffer of in_bytes + out_bytes (input first): copied in, run, copied back.
  template <typename EnqueueFn>
  Status RunStagedPair(const char* what, Deadline deadline, const void* input, size_t in_bytes,
                       void* output, size_t out_bytes, EnqueueFn enqueue) {
    std::vector<char> joined(in_bytes + out_bytes);
    if (in_bytes > 0) std::memcpy(joined.data(), input, in_bytes);
    GYRE_RETURN_IF_ERROR(
        RunStaged(what, deadline, joined.data(), joined.size(), true, [&](void* dev) {
          char* base = static_cast<char*>(dev);
          return enqueue(base, base + in_bytes);
        }));
    std::memcpy(output, joined.data() + in_bytes, out_bytes);
    return Status::Ok();
  }

  // Requires call_mu_ held (or the destructor).
  void AbortLocked() {
    aborted_.store(true);
    if (comm_ != nullptr) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
  }

  const int rank_;
  const int size_;
  const int device_;
  std::mutex call_mu_;  // held for the whole of a call; guards comm_
  ncclComm_t comm_;
  cudaStream_t stream_;
  void* scratch_;  // one float on the device, for Barrier
  // Host-memory collectives: pinned and device staging of staged_bytes_ each (under call_mu_).
  void* pinned_ = nullptr;
  void* staging_ = nullptr;
  size_t staged_bytes_ = 0;
  std::atomic<bool> aborted_{false};
};

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions& options) {
  if (options.size < 1) return InvalidArgument("nccl group size must be at least 1");
  if (options.rank < 0 || options.rank >= options.size) {
    return InvalidArgument("nccl rank " + std::to_string(options.rank) + " outside a group of " +
                           std::to_string(options.size));
  }
  ncclUniqueId id;
  if (options.unique_id.size() != sizeof(id.internal)) {
    return InvalidArgument("nccl unique id has " + std::to_string(options.unique_id.size()) +
                           " bytes, expected " + std::to_string(sizeof(id.internal)));
  }
  if (options.connect_timeout_s <= 0) return InvalidArgument("nccl connect timeout must be > 0");
  std::memcpy(id.internal, options.unique_id.data(), sizeof(id.internal));
  int devices = 0;
  cudaError_t ce = cudaGetDeviceCount(&devices);
  if (ce != cudaSuccess || devices == 0) {
    return FailedPrecondition("nccl needs a CUDA device: " +
                              (ce != cudaSuccess ? CudaError(ce) : std::string("none found")));
  }
  if (options.device < 0 || options.device >= devices) {
    return InvalidArgument("cuda device " + std::to_string(options.device) + " does not exist (" +
                           std::to_string(devices) + " found)");
  }
  ce = cudaSetDevice(options.device);
  if (ce != cudaSuccess) return Unavailable("cudaSetDevice: " + CudaError(ce));
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;
  ce = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (ce == cudaSuccess) ce = cudaMalloc(&scratch, sizeof(float));
  if (ce == cudaSuccess) ce = cudaMemset(scratch, 0, sizeof(float));
  auto release_cuda = [&] {
    if (scratch != nullptr) cudaFree(scratch);
    if (stream != nullptr) cudaStreamDestroy(stream);
  };
  if (ce != cudaSuccess) {
    release_cuda();
    return Unavailable("cuda setup for nccl: " + CudaError(ce));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, options.size, id, options.rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    release_cuda();
    return Unavailable("ncclCommInitRankConfig: " + NcclError(r));
  }
  const Deadline deadline = DeadlineAfter(options.connect_timeout_s);
  Status status;
  PollUntil([&] {
    ncclResult_t async = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(comm, &async);
    if (q != ncclSuccess) async = q;
    if (async == ncclSuccess) return true;
    if (async != ncclInProgress) {
      status = Unavailable("nccl group formation failed: " + NcclError(async));
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      status = DeadlineExceeded("nccl group of " + std::to_string(options.size) +
                                " did not form within " +
                                std::to_string(options.connect_timeout_s) + " s");
      return true;
    }
    return false;
  });
  if (!status.ok()) {
    ncclCommAbort(comm);
    release_cuda();
    return status;
  }
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(options.rank, options.size, options.device, comm, stream, scratch));
}

}  // namespace gyre::comm
