// GlooCommunicator: c10d::ProcessGroupGloo over a c10d::TCPStore.
//
// Build note: the PyTorch wheel ships libtorch's Gloo code but not Gloo's headers, which
// ProcessGroupGloo.hpp includes. Gyre compiles this file against Debian's libgloo-dev headers
// and never links Debian's libgloo: every Gloo object is created and used inside libtorch, and
// this file only holds them through shared pointers and calls ProcessGroupGloo's out-of-line
// (exported) members. Debian's Gloo predates the store "v2" API, so ProcessGroupGloo.hpp leaves
// those GlooStore overrides out here; nothing in this file constructs a GlooStore.
//
// Deadlines: each collective carries the time left as its Gloo timeout (so Gloo itself gives up
// at the deadline), and the caller waits on the work's future with a condition variable that
// also wakes on Abort(). A broadcast within a pair (the weight groups) is a send and a receive
// instead, whose wait Abort() ends inside Gloo itself (RunPointToPoint).

#include "comm/gloo_communicator.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "common/logging.h"

namespace gyre::comm {
namespace {

std::chrono::milliseconds ToMillis(double seconds) {
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(seconds * 1000.0)));
}

StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return InvalidArgument("store address '" + address + "' is not HOST:PORT");
  }
  const std::string port_text = address.substr(colon + 1);
  char* end = nullptr;
  const long port = std::strtol(port_text.c_str(), &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535) {
    return InvalidArgument("store address '" + address + "' has a bad port");
  }
  return std::make_pair(address.substr(0, colon), static_cast<int>(port));
}

at::ScalarType ToScalarType(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return at::kFloat;
    case DataType::kFloat64:
      return at::kDouble;
    case DataType::kBFloat16:
      return at::kBFloat16;
    case DataType::kFloat16:
      return at::kHalf;
  }
  return at::kFloat;
}

// Completion of one c10d work item, signalled from Gloo's worker thread through the work's
// future. Shared with the callback, which may run after the waiting call has returned.
struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
struct StoreServer::Impl {
  std::string host;
  int port = 0;
  c10::intrusive_ptr<c10d::TCPStore> store;
};

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreServer::~StoreServer() = default;

std::string StoreServer::address() const { return impl_->host + ":" + std::to_string(port()); }
int StoreServer::port() const { return impl_->port; }

StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& host) {
  // Bind the listening socket ourselves: TCPStore would otherwise listen on every interface. The
  // store takes the socket over (masterListenFd) and keeps the OS-chosen port.
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  const std::string ip = host == "localhost" ? "127.0.0.1" : host;
  if (::inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    return InvalidArgument("store host '" + host + "' is not an IPv4 address");
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unavailable(std::string("socket: ") + std::strerror(errno));
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 128) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return Unavailable("cannot listen on " + host + ": " + std::strerror(err));
  }
  auto impl = std::make_unique<Impl>();
  impl->host = ip;
  impl->port = ntohs(addr.sin_port);
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(impl->port);
  opts.isServer = true;
  opts.waitWorkers = false;
  opts.masterListenFd = fd;
  opts.timeout = std::chrono::seconds(60);
  try {
    impl->store = c10::make_intrusive<c10d::TCPStore>(ip, opts);
  } catch (const std::exception& e) {
    ::close(fd);
    return Unavailable(std::string("cannot start the rendezvous store: ") + e.what());
  }
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

// ---------------------------------------------------------------------------------------------
class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(int rank, int size, c10::intrusive_ptr<c10d::ProcessGroupGloo> pg)
      : rank_(rank), size_(size), pg_(std::move(pg)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "gloo"; }
  bool aborted() const override { return aborted_.load(); }

  Status Broadcast(void* data, size_t bytes, int root, Deadline deadline) override {
    if (root < 0 || root >= size_) {
      return InvalidArgument("broadcast root " + std::to_string(root) + " outside a group of " +
                             std::to_string(size_));
    }
    if (bytes == 0) return Status::Ok();
    if (size_ == 2) {
      // A pair (every weight group): a send and a receive, which Abort() can end inside Gloo.
      return RunPointToPoint(rank_ == root, data, bytes, 1 - rank_, deadline);
    }
    return Run("broadcast", deadline, [&](std::chrono::milliseconds timeout) {
      std::vector<at::Tensor> tensors = {
          at::from_blob(data, {static_cast<int64_t>(bytes)}, at::TensorOptions(at::kByte))};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      o.timeout = timeout;
      return pg_->broadcast(tensors, o);
    });
  }

  Status AllReduceSum(void* data, size_t count, DataType type, Deadline deadline) override {
    if (count == 0) return Status::Ok();
    return Run("all-reduce", deadline, [&](std::chrono::milliseconds timeout) {
      std::vector<at::Tensor> tensors = {at::from_blob(data, {static_cast<int64_t>(count)},
                                                       at::TensorOptions(ToScalarType(type)))};
      c10d::AllreduceOptions o;
      o.reduceOp = c10d::ReduceOp::SUM;
      o.timeout = timeout;
      return pg_->allreduce(tensors, o);
    });
  }

  // ProcessGroupGloo copies a whole reduce-scatter input, or a whole all-gather output, through a
  // flat buffer of its own: a large one (a unit of sharded parameters, a ZeRO-1/2 model) goes in
  // segments of at most kSegmentBytes (all ranks' parts) each, straight into their places.
  Status ReduceScatterSum(const void* input, void* output, size_t count, DataType type,
                          Deadline deadline) override {
    return InSegments("reduce-scatter", output, input, count, type, deadline,
                      [&](at::Tensor& mine, std::vector<at::Tensor>& parts, auto timeout) {
                        std::vector<at::Tensor> out = {mine};
                        std::vector<std::vector<at::Tensor>> in = {parts};
                        c10d::ReduceScatterOptions o;
                        o.reduceOp = c10d::ReduceOp::SUM;
                        o.timeout = timeout;
                        return pg_->reduce_scatter(out, in, o);
                      });
  }

  Status AllGather(const void* input, void* output, size_t count, DataType type,
                   Deadline deadline) override {
    return InSegments("all-gather", const_cast<void*>(input), output, count, type, deadline,
                      [&](at::Tensor& mine, std::vector<at::Tensor>& parts, auto timeout) {
                        std::vector<at::Tensor> in = {mine};
                        std::vector<std::vector<at::Tensor>> out = {parts};
                        c10d::AllgatherOptions o;
                        o.timeout = timeout;
                        return pg_->allgather(out, in, o);
                      });
  }

  Status Scatter(const void* input, void* output, size_t bytes, int root,
                 Deadline deadline) override {
    GYRE_RETURN_IF_ERROR(CheckScatterArguments(rank_, size_, input, root));
    if (bytes == 0) return Status::Ok();
    if (size_ == 1) {
      std::memcpy(output, input, bytes);
      return Status::Ok();
    }
    return Run("scatter", deadline, [&](std::chrono::milliseconds timeout) {
      const auto opts = at::TensorOptions(at::kByte);
      std::vector<at::Tensor> out = {at::from_blob(output, {static_cast<int64_t>(bytes)}, opts)};
      std::vector<std::vector<at::Tensor>> in;
      if (rank_ == root) {
        in.emplace_back();
        const auto* base = static_cast<const uint8_t*>(input);
        for (int r = 0; r < size_; ++r) {
          in.back().push_back(at::from_blob(const_cast<uint8_t*>(base) + r * bytes,
                                            {static_cast<int64_t>(bytes)}, opts));
        }
      }
      c10d::ScatterOptions o;
      o.rootRank = root;
      o.timeout = timeout;
      return pg_->scatter(out, in, o);
    });
  }

  Status Barrier(Deadline deadline) override {
    return Run("barrier", deadline, [&](std::chrono::milliseconds timeout) {
      c10d::BarrierOptions o;
      o.timeout = timeout;
      return pg_->barrier(o);
    });
  }

  void Abort() override {
    aborted_.store(true);
    std::lock_guard<std::mutex> lock(mu_);
    if (inflight_) {
      std::lock_guard<std::mutex> l(inflight_->mu);
      inflight_->cv.notify_all();
    }
    if (inflight_p2p_) inflight_p2p_->abort();  // ends Gloo's wait for the send or receive
  }

 private:
  // A broadcast within a pair as one send (root) or receive, waited for on this thread. Unlike a
  // collective, whose operation goes on inside Gloo after an Abort() until its own timeout, the
  // work's abort() ends Gloo's wait, and dropping the work destroys Gloo's buffer, which waits
  // for any transfer touching `data` to finish. So when this returns, for any reason, Gloo no
  // longer reads or writes `data`: the caller may free it, even after an abort (a weight
  // transfer to a receiver declared dead).
  Status RunPointToPoint(bool send, void* data, size_t bytes, int peer, Deadline deadline) {
    const std::string what = send ? "send" : "receive";
    if (aborted_.load()) return Aborted("gloo " + what + ": communicator aborted");
    const double left = SecondsLeft(deadline);
    if (left <= 0) {
      aborted_.store(true);
      return DeadlineExceeded("gloo " + what + ": deadline passed before the call");
    }
    std::vector<at::Tensor> tensors = {
        at::from_blob(data, {static_cast<int64_t>(bytes)}, at::TensorOptions(at::kByte))};
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = send ? pg_->send(tensors, peer, 0) : pg_->recv(tensors, peer, 0);
    } catch (const std::exception& e) {
      aborted_.store(true);
      return Unavailable("gloo " + what + " failed to start: " + FirstLine(e.what()));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      inflight_p2p_ = work;
      // An Abort() between the check above and here found nothing to end: end it now.
      if (aborted_.load()) work->abort();
    }
    bool completed = false;
    std::string failure;
    try {
      completed = work->wait(ToMillis(left));
    } catch (const std::exception& e) {
      failure = e.what();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      inflight_p2p_.reset();
    }
    work.reset();  // the only reference: Gloo's buffer goes, after any transfer still using it
    if (!failure.empty()) {
      aborted_.store(true);
      // Gloo's own timeout is the time left in whole milliseconds: it may fire a moment early.
      if (SecondsLeft(deadline) <= 0 || failure.find("Timed out") != std::string::npos) {
        return DeadlineExceeded("gloo " + what +
                                " did not finish within its deadline: " + FirstLine(failure));
      }
      return Unavailable("gloo " + what + " failed: " + FirstLine(failure));
    }
    if (!completed) {  // abort() ended the wait
      aborted_.store(true);
      return Aborted("gloo " + what + " aborted");
    }
    return Status::Ok();
  }

  // A collective between this rank's `count` elements at `mine` and every rank's at `all` (rank
  // r's at all + r * count), one segment at a time: start(mine's segment, the ranks' segments,
  // timeout) starts it.
  template <typename StartFn>
  Status InSegments(const char* what, const void* mine, const void* all, size_t count,
                    DataType type, Deadline deadline, StartFn start) {
    if (count == 0) return Status::Ok();
    const auto opts = at::TensorOptions(ToScalarType(type));
    const size_t elem = DataTypeSize(type);
    const size_t per = std::max<size_t>(1, kSegmentBytes / (elem * size_));
    auto* mine_bytes = static_cast<char*>(const_cast<void*>(mine));
    auto* all_bytes = static_cast<char*>(const_cast<void*>(all));
    for (size_t s = 0; s < count; s += per) {
      const auto n = static_cast<int64_t>(std::min(per, count - s));
      GYRE_RETURN_IF_ERROR(Run(what, deadline, [&](std::chrono::milliseconds timeout) {
        at::Tensor own = at::from_blob(mine_bytes + s * elem, {n}, opts);
        std::vector<at::Tensor> parts;
        for (int r = 0; r < size_; ++r) {
          parts.push_back(at::from_blob(all_bytes + (r * count + s) * elem, {n}, opts));
        }
        return start(own, parts, timeout);
      }));
    }
    return Status::Ok();
  }

  // Starts one collective with `start(timeout)` and waits for it until `deadline` or Abort().
  template <typename StartFn>
  Status Run(const char* what, Deadline deadline, StartFn start) {
    if (aborted_.load()) return Aborted(std::string("gloo ") + what + ": communicator aborted");
    const double left = SecondsLeft(deadline);
    if (left <= 0) {
      aborted_.store(true);
      return DeadlineExceeded(std::string("gloo ") + what + ": deadline passed before the call");
    }
    auto completion = std::make_shared<Completion>();
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = start(ToMillis(left));
      auto signal = [completion] {
        std::lock_guard<std::mutex> l(completion->mu);
        completion->done = true;
        completion->cv.notify_all();
      };
      c10::intrusive_ptr<c10::ivalue::Future> future;
      try {
        future = work->getFuture();
      } catch (const std::exception&) {
        // Some of ProcessGroupGloo's work kinds (reduce-scatter in libtorch 2.11) have no
        // future: a helper thread waits instead. Gloo ends the work by its own timeout (the
        // deadline) at the latest, so the thread always finishes; it owns what it touches.
      }
      if (future) {
        future->addCallback([signal](c10::ivalue::Future&) { signal(); });
      } else {
        std::thread([work, signal] {
          try {
            work->wait();
          } catch (...) {  // the failure is read from the work below
          }
          signal();
        }).detach();
      }
    } catch (const std::exception& e) {
      aborted_.store(true);
      return Unavailable(std::string("gloo ") + what + " failed to start: " + e.what());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      inflight_ = completion;
    }
    bool done;
    {
      std::unique_lock<std::mutex> l(completion->mu);
      done = completion->cv.wait_until(l, deadline, [&] {
        return completion->done || aborted_.load();
      }) && completion->done;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      inflight_.reset();
    }
    if (!done) {
      // The operation keeps running inside Gloo until its own timeout (the same deadline); the
      // group is unusable from here on.
      if (aborted_.exchange(true)) return Aborted(std::string("gloo ") + what + " aborted");
      return DeadlineExceeded(std::string("gloo ") + what + " did not finish within its deadline");
    }
    if (!work->isSuccess()) {
      aborted_.store(true);
      std::string why = "unknown error";
      try {
        std::rethrow_exception(work->exception());
      } catch (const std::exception& e) {
        why = e.what();
      } catch (...) {
      }
      // Gloo reports its own timeout as an I/O error; call it what it is.
      if (SecondsLeft(deadline) <= 0) {
        return DeadlineExceeded(std::string("gloo ") + what +
                                " did not finish within its deadline: " + FirstLine(why));
      }
      return Unavailable(std::string("gloo ") + what + " failed: " + FirstLine(why));
    }
    return Status::Ok();
  }

  const int rank_;
  const int size_;
  static constexpr size_t kSegmentBytes = size_t{8} << 20;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  std::atomic<bool> aborted_{false};
  std::mutex mu_;                                // guards inflight_ and inflight_p2p_
  std::shared_ptr<Completion> inflight_;         // the collective waiting now, for Abort()
  c10::intrusive_ptr<c10d::Work> inflight_p2p_;  // the send or receive waiting now
};

namespace {

// A client of the store at `address`, connected within `timeout_s`.
StatusOr<c10::intrusive_ptr<c10d::TCPStore>> ConnectStore(const std::string& address,
                                                          double timeout_s) {
  GYRE_ASSIGN_OR_RETURN(auto host_port, SplitHostPort(address));
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(host_port.second);
    so.isServer = false;
    so.waitWorkers = false;
    so.timeout = ToMillis(timeout_s);
    return c10::make_intrusive<c10d::TCPStore>(host_port.first, so);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return Unavailable("cannot reach the rendezvous store " + address + ": " +
                       what.substr(0, what.find('\n')));
  }
}

}  // namespace

Status StoreSet(const std::string& address, const std::string& key, const std::string& value,
                double timeout_s) {
  GYRE_ASSIGN_OR_RETURN(auto store, ConnectStore(address, timeout_s));
  try {
    store->set("gyre/" + key, std::vector<uint8_t>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return Unavailable("store " + address + ": cannot set " + key + ": " +
                       what.substr(0, what.find('\n')));
  }
  return Status::Ok();
}

StatusOr<std::string> StoreGet(const std::string& address, const std::string& key,
                               double timeout_s) {
  GYRE_ASSIGN_OR_RETURN(auto store, ConnectStore(address, timeout_s));
  try {
    const std::vector<uint8_t> v = store->get("gyre/" + key);  // waits up to the timeout
    return std::string(v.begin(), v.end());
  } catch (const std::exception& e) {
    const std::string what = e.what();
    const std::string first = what.substr(0, what.find('\n'));
    const std::string msg = "store " + address + ": no value for " + key + ": " + first;
    if (first.find("imeout") != std::string::npos || first.find("imed out") != std::string::npos) {
      return DeadlineExceeded(msg);
    }
    return Unavailable(msg);
  }
}

// libtorch 2.11's flight recorder (one per process, on by default with 2000 entries) registers
// each group in a map before taking its own lock, so two groups of one process that start their
// first collectives together can corrupt that map: a crash, a failed collective, or a thread that
// spins forever (seen in `gyre bench dp-step` and reproduced by ManyGroupsStartingTogether...).
// Gyre has its own deadlines and error messages, so it turns the recorder off before the first
// group exists; the variable is read once, when the recorder is first used.
void DisableFlightRecorder() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* set = std::getenv("TORCH_FR_BUFFER_SIZE");
    if (set == nullptr) set = std::getenv("TORCH_NCCL_TRACE_BUFFER_SIZE");
    if (set != nullptr && std::string(set) != "0") {
      GYRE_LOG_WARN(
          "ignoring TORCH_FR_BUFFER_SIZE={}: libtorch's flight recorder is not safe with "
          "several Gloo groups in one process, so Gyre keeps it off",
          set);
    }
    ::setenv("TORCH_FR_BUFFER_SIZE", "0", 1);
    ::unsetenv("TORCH_NCCL_TRACE_BUFFER_SIZE");  // the older name of the same setting
  });
}

// Gloo's TCP transport writes to its sockets with writev(), which raises SIGPIPE when the peer
// has died; with the default disposition that kills this process silently (exit by signal, no
// log) instead of failing the collective with an error Gyre can report. So before the first
// group exists, a process that still has the default SIGPIPE disposition ignores it: writes to a
// dead peer then return EPIPE. A handler the embedding program installed is left alone. Child
// processes Gyre starts get the default back (common/subprocess.cc).
void IgnoreBrokenPipes() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) != 0) return;
    if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) return;
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    if (::sigaction(SIGPIPE, &ignore, nullptr) == 0) {
      GYRE_LOG_DEBUG("SIGPIPE ignored: a gloo peer that dies fails the collective instead");
    }
  });
}

StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& options) {
  DisableFlightRecorder();
  IgnoreBrokenPipes();
  if (options.size < 1) return InvalidArgument("gloo group size must be at least 1");
  if (options.rank < 0 || options.rank >= options.size) {
    return InvalidArgument("gloo rank " + std::to_string(options.rank) + " outside a group of " +
                           std::to_string(options.size));
  }
  if (options.group.empty()) return InvalidArgument("gloo group name is empty");
  if (options.connect_timeout_s <= 0) return InvalidArgument("gloo connect timeout must be > 0");
  GYRE_ASSIGN_OR_RETURN(auto host_port, SplitHostPort(options.store_address));
  const auto timeout = ToMillis(options.connect_timeout_s);
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(host_port.second);
    so.isServer = false;
    so.waitWorkers = false;
    so.timeout = timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(host_port.first, so);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("gyre/" + options.group, store);
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
    gloo_options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(options.bind_host));
    // One worker thread: Gyre issues one collective at a time per group.
    gloo_options->threads = 1;
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, options.rank, options.size,
                                                          gloo_options);
    return std::unique_ptr<Communicator>(
        new GlooCommunicator(options.rank, options.size, std::move(pg)));
  } catch (const std::exception& e) {
    const std::string what = e.what();
    const std::string first = what.substr(0, what.find('\n'));
    const std::string msg = "cannot form gloo group '" + options.group + "' (rank " +
                            std::to_string(options.rank) + " of " + std::to_string(options.size) +
                            ") via store " + options.store_address + ": " + first;
    if (first.find("imeout") != std::string::npos || first.find("imed out") != std::string::npos) {
      return DeadlineExceeded(msg);
    }
    return Unavailable(msg);
  }
}

}  // namespace gyre::comm
