// gyre bench weight-sync: moves one policy version of --size bytes from this process to
// --receivers receiver processes (this binary, re-executed) on loopback, over each transport and
// bucket size, and compares every figure with a naive baseline measured in the same run: one
// unbucketed gRPC message carrying the whole payload.
//
// Rendezvous: this process runs the Gloo store (OS-chosen port) and gives its address to the
// receivers on their command line; each receiver writes its gRPC address (also an OS-chosen port)
// to a file in the run's temporary directory. Every transfer is verified: gRPC receipts are
// compared bucket by bucket, and a Gloo publish succeeds only when every receiver acknowledged
// every bucket's CRC-32.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <limits>
#include <mutex>
#include <thread>

#include "bench/bench.h"
#include "comm/cuda_ipc.h"
#include "comm/device_weights.h"
#include "comm/gloo_communicator.h"
#include "comm/weight_broadcast.h"
#include "comm/weight_sync.h"
#include "common/command_line.h"
#include "common/file_util.h"
#include "common/subprocess.h"
#include "kernels/device_info.h"
#include "rpc/rpc_util.h"

namespace gyre::bench {
namespace {

constexpr char kWeightSyncDetails[] =
    "Reports, per transport and bucket size, the median seconds over the repetitions, GB/s\n"
    "(payload bytes / seconds, 1 GB = 1e9 bytes) and speedup = baseline seconds / seconds. The\n"
    "baseline, measured in the same run, is one unbucketed gRPC message carrying the whole\n"
    "payload; it always runs. Every transfer is verified with per-bucket CRC-32 receipts.\n"
    "Transports: grpc (bucketed gRPC stream), gloo (bucketed Gloo broadcast), cuda_ipc\n"
    "(colocated GPU update: device copy into an exported buffer, GPU checksums, each receiver\n"
    "copies it out; needs a GPU).\n"
    "\n"
    "Progress goes to stderr. NCCL needs one GPU per process and is not part of this bench.\n";

StatusOr<uint64_t> ParseSize(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    return InvalidArgument("size '" + text + "' is not a number with an optional unit");
  }
  std::string unit = text.substr(used);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "KB") scale = 1e3;
  if (unit == "MB") scale = 1e6;
  if (unit == "GB") scale = 1e9;
  if (unit == "KIB") scale = 1024.0;
  if (unit == "MIB") scale = 1024.0 * 1024;
  if (unit == "GIB") scale = 1024.0 * 1024 * 1024;
  if (scale == 0) return InvalidArgument("size '" + text + "' has an unknown unit");
  if (!(value > 0) || value * scale > 64e9) {
    return InvalidArgument("size '" + text + "' must be between 1 byte and 64 GB");
  }
  return static_cast<uint64_t>(value * scale);
}

std::string ReadSmallFile(const std::string& path) {
  std::string out;
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    char buf[256];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
    std::fclose(f);
  }
  return out;
}

// gRPC with no message-size limit (the baseline sends the whole payload as one message).
std::shared_ptr<grpc::Channel> UnlimitedChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// ---------------------------------------------------------------------------------------------
// Receiver process.

// Accepts weight streams (Rollout.LoadWeights), verifies them and keeps nothing but the bytes.
class SinkService final : public v1::Rollout::Service {
 public:
  grpc::Status LoadWeights(grpc::ServerContext*, grpc::ServerReader<v1::WeightChunk>* reader,
                           v1::WeightReceipt* receipt) override {
    std::lock_guard<std::mutex> lock(mu_);
    // Its only sender is the bench process that spawned it, whose --size sets the payload.
    return rpc::ToGrpc(comm::ReceiveWeightStream(reader, &payload_, receipt,
                                                 std::numeric_limits<uint64_t>::max()));
  }
  // cuda_ipc: copies the sender's buffer device-to-device into this process's own buffer and
  // checks every bucket on the GPU, as a colocated rollout worker does.
  grpc::Status ReceiveWeights(grpc::ServerContext*, const v1::ReceiveWeightsRequest* req,
                              v1::WeightReceipt* receipt) override {
    std::lock_guard<std::mutex> lock(mu_);
    const auto t0 = std::chrono::steady_clock::now();
    const comm::Deadline deadline = comm::DeadlineAfter(req->timeout_s());
    if (!mapping_ || handle_ != req->ipc_handle()) {
      mapping_.reset();
      auto m = comm::CudaIpcMapping::Open(req->ipc_handle(), 0);
      if (!m.ok()) return rpc::ToGrpc(m.status());
      mapping_ = std::move(*m);
      handle_ = req->ipc_handle();
    }
    Status s = comm::EnsureDeviceBuffer(req->total_bytes(), 0, &buffer_);
    if (s.ok()) s = mapping_->CopyTo(buffer_->data(), 0, req->total_bytes(), deadline);
    if (!s.ok()) return rpc::ToGrpc(s);
    auto crcs = comm::DeviceBucketCrc32(buffer_->data(), req->total_bytes(), req->bucket_bytes(), 0,
                                        deadline);
    if (!crcs.ok()) return rpc::ToGrpc(crcs.status());
    if (static_cast<int>(crcs->size()) != req->sent_crc32_size()) {
      return rpc::ToGrpc(DataLoss("bucket count differs from the sender's"));
    }
    for (size_t b = 0; b < crcs->size(); ++b) {
      if ((*crcs)[b] != req->sent_crc32(static_cast<int>(b))) {
        return rpc::ToGrpc(DataLoss("bucket " + std::to_string(b) + " failed its CRC-32 check"));
      }
    }
    receipt->set_version(req->version());
    for (uint32_t c : *crcs) receipt->add_bucket_crc32(c);
    receipt->set_bytes(req->total_bytes());
    receipt->set_seconds(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return grpc::Status::OK;
  }
  grpc::Status Stop(grpc::ServerContext*, const v1::StopRequest*, v1::StopResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
    return grpc::Status::OK;
  }
  void WaitForStop() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stop_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  comm::WeightPayload payload_;
  std::unique_ptr<comm::CudaIpcMapping> mapping_;
  std::string handle_;
  std::unique_ptr<comm::DeviceBuffer> buffer_;
};

// What a receiver process needs from its parent: the run's directory, the Gloo store (empty
// without gloo), its rank in a group of `world`, and each transfer's deadline.
struct ReceiverArgs {
  std::string dir, store;
  int rank = 0, world = 0;
  double deadline_s = 300;
};

int RunReceiver(const ReceiverArgs& args) {
  const std::string &dir = args.dir, &store = args.store;
  const int rank = args.rank, world = args.world;
  const double deadline_s = args.deadline_s;
  const std::string me = "receiver " + std::to_string(rank);
  SinkService sink;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterService(&sink);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::fprintf(stderr, "%s: cannot start a gRPC server on loopback\n", me.c_str());
    return 1;
  }
  Status s = WriteFileAtomic(dir + "/receiver-" + std::to_string(rank) + ".addr",
                             "127.0.0.1:" + std::to_string(port));
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", me.c_str(), s.ToString().c_str());
    return 1;
  }
  int rc = 0;
  if (!store.empty()) {
    comm::GlooOptions o;
    o.store_address = store;
    o.group = "bench";
    o.rank = rank;
    o.size = world;
    auto c = comm::CreateGlooCommunicator(o);
    if (!c.ok()) {
      std::fprintf(stderr, "%s: %s\n", me.c_str(), c.status().ToString().c_str());
      return 1;
    }
    comm::WeightPayload payload;
    int versions = 0;
    while (true) {
      // The wait for a header includes the time the sender spends on other transports.
      auto r = comm::ReceivePublishedWeights(c->get(), 0, comm::DeadlineAfter(deadline_s + 3600),
                                             &payload);
      if (r.status().code() == StatusCode::kOutOfRange) break;
      if (!r.ok()) {
        std::fprintf(stderr, "%s: %s\n", me.c_str(), r.status().ToString().c_str());
        rc = 1;
        if (c->get()->aborted()) break;
        continue;
      }
      ++versions;
    }
    std::fprintf(stderr, "%s: received %d versions over gloo\n", me.c_str(), versions);
  }
  sink.WaitForStop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return rc;
}

// ---------------------------------------------------------------------------------------------
// Sender (the benchmark itself).

struct Receivers {
  std::vector<pid_t> pids;
  std::vector<std::string> addresses;
  std::vector<std::unique_ptr<v1::Rollout::Stub>> stubs;
};

// A colocated update over CUDA IPC, as a job does it: the sender copies its "parameters" into the
// exported buffer (device to device), checksums every bucket on the GPU, and every receiver copies
// the buffer into its own device memory and checks it. Returns the first error.
Status SendCudaIpcToAll(Receivers* rx, const comm::DeviceBuffer& params,
                        const comm::DeviceBuffer& published, const std::string& handle,
                        int64_t version, int64_t bucket, double deadline_s) {
  const comm::Deadline deadline = comm::DeadlineAfter(deadline_s);
  GYRE_RETURN_IF_ERROR(comm::CopyDeviceToDevice(published.data(), params.data(), params.size(),
                                                published.device(), deadline));
  GYRE_ASSIGN_OR_RETURN(auto crcs, comm::DeviceBucketCrc32(published.data(), params.size(), bucket,
                                                           published.device(), deadline));
  v1::ReceiveWeightsRequest req;
  req.set_transport("cuda_ipc");
  req.set_timeout_s(deadline_s);
  req.set_ipc_handle(handle);
  req.set_version(version);
  req.set_total_bytes(params.size());
  req.set_bucket_bytes(bucket);
  for (uint32_t c : crcs) req.add_sent_crc32(c);
  std::vector<std::future<Status>> futures;
  for (auto& stub : rx->stubs) {
    auto* st = stub.get();
    futures.push_back(std::async(std::launch::async, [st, &req, &crcs, deadline_s, version] {
      grpc::ClientContext ctx;
      rpc::SetDeadline(&ctx, deadline_s + 10);
      v1::WeightReceipt receipt;
      Status s = rpc::FromGrpc(st->ReceiveWeights(&ctx, req, &receipt), "cuda_ipc receive");
      if (!s.ok()) return s;
      bool match = receipt.version() == version &&
                   receipt.bucket_crc32_size() == static_cast<int>(crcs.size());
      for (size_t b = 0; match && b < crcs.size(); ++b) {
        match = receipt.bucket_crc32(static_cast<int>(b)) == crcs[b];
      }
      return match ? Status::Ok() : DataLoss("receipt does not match the sent checksums");
    }));
  }
  Status first;
  for (size_t i = 0; i < futures.size(); ++i) {
    Status s = futures[i].get();
    if (!s.ok() && first.ok()) first = s.WithContext("receiver " + std::to_string(i + 1));
  }
  return first;
}

// Sends `payload` to every receiver concurrently over gRPC in buckets of `bucket` bytes and
// checks each receipt (SendWeights compares it with the CRC-32 it sent).
Status SendGrpcToAll(Receivers* rx, const comm::WeightPayload& payload, int64_t bucket,
                     double deadline_s) {
  std::vector<std::future<StatusOr<comm::SendResult>>> futures;
  for (auto& stub : rx->stubs) {
    auto* s = stub.get();
    futures.push_back(std::async(std::launch::async, [s, &payload, bucket, deadline_s] {
      return comm::SendWeights(s, payload, bucket, deadline_s);
    }));
  }
  Status first;
  for (size_t i = 0; i < futures.size(); ++i) {
    auto r = futures[i].get();
    if (!r.ok() && first.ok()) first = r.status().WithContext("receiver " + std::to_string(i + 1));
  }
  return first;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "gyre bench weight-sync: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int RunBenchWeightSync(const std::vector<std::string>& args) {
  std::string size_text = "1GB";
  std::vector<int64_t> bucket_mib = {16, 64, 256};
  int64_t receivers = 1, reps = 3;
  double deadline_s = 300;
  std::vector<std::string> transports = {"grpc", "gloo"};
  std::string json_path;
  bool serve_receiver = false;
  ReceiverArgs receiver;
  auto app = NewCommand(
      "gyre bench weight-sync",
      "Moves one policy version of SIZE bytes to N receiver processes on loopback per transport.",
      kWeightSyncDetails);
  app->add_option("--size", size_text, "payload size: 1GB, 512MB, 64MiB, 1000000 (bytes)")
      ->type_name("SIZE")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            const StatusOr<uint64_t> size = ParseSize(text);
            return size.ok() ? "" : size.status().message();
          },
          ""));
  app->add_option("--bucket-mb", bucket_mib, "bucket sizes in MiB, comma-separated")
      ->delimiter(',')
      ->check(Positive())
      ->default_str("16,64,256");
  app->add_option("--receivers", receivers, "receiver processes")->check(CLI::Range(1, 64));
  AddListOption(app.get(), "--transports", &transports, {"grpc", "gloo", "cuda_ipc"},
                "the transports to measure, comma-separated");
  app->add_option("--reps", reps, "timed repetitions per row, after one untimed warm-up")
      ->check(Positive());
  app->add_option("--deadline-s", deadline_s, "deadline of each transfer")->check(Positive());
  app->add_option("--json", json_path, "also write the figures as JSON")->type_name("FILE");
  // A receiver process, started by this command with these options.
  app->add_flag("--serve-receiver", serve_receiver)->group("");
  app->add_option("--dir", receiver.dir)->group("");
  app->add_option("--store", receiver.store)->group("");
  app->add_option("--rank", receiver.rank)->group("");
  app->add_option("--world", receiver.world)->group("");
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  if (serve_receiver) {
    receiver.deadline_s = deadline_s;
    return RunReceiver(receiver);
  }
  const uint64_t size = *ParseSize(size_text);
  auto uses = [&](const char* transport) {
    return std::find(transports.begin(), transports.end(), transport) != transports.end();
  };
  const bool use_grpc = uses("grpc"), use_gloo = uses("gloo"), use_cuda_ipc = uses("cuda_ipc");

  // The payload: one flat uint8 tensor of pseudo-random bytes.
  std::fprintf(stderr, "weight-sync: preparing %.3f GB payload\n", size / 1e9);
  comm::WeightPayload payload;
  payload.version = 0;
  payload.bytes.resize(size);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (uint64_t i = 0; i + 8 <= size; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(payload.bytes.data() + i, &x, 8);
  }
  model::TensorEntry entry;
  entry.name = "payload";
  entry.shape = {static_cast<int64_t>(size)};
  entry.dtype = "uint8";
  entry.nbytes = size;
  payload.manifest.push_back(entry);

  // cuda_ipc: the "parameters" and the exported buffer they are published through, on GPU 0.
  std::unique_ptr<comm::DeviceBuffer> ipc_params, ipc_published;
  std::string ipc_handle;
  if (use_cuda_ipc) {
    if (kernels::CudaDeviceCount() == 0) {
      return Fail(FailedPrecondition("--transports cuda_ipc needs a CUDA device; none is usable"));
    }
    auto a = comm::DeviceBuffer::Allocate(size, 0);
    if (!a.ok()) return Fail(a.status());
    ipc_params = std::move(*a);
    auto b = comm::DeviceBuffer::Allocate(size, 0);
    if (!b.ok()) return Fail(b.status());
    ipc_published = std::move(*b);
    Status up = comm::CopyHostToDevice(ipc_params->data(), payload.bytes.data(), size, 0,
                                       comm::DeadlineAfter(deadline_s));
    if (!up.ok()) return Fail(up);
    auto h = comm::ExportCudaIpcHandle(ipc_published->data());
    if (!h.ok()) return Fail(h.status());
    ipc_handle = *h;
  }

  // Rendezvous and receivers.
  const std::string dir = TempDirectory() + "/gyre-bench-weight-sync-" + std::to_string(::getpid());
  if (Status s = MakeDirs(dir); !s.ok()) return Fail(s);
  std::unique_ptr<comm::StoreServer> store;
  if (use_gloo) {
    auto st = comm::StoreServer::Start("127.0.0.1");
    if (!st.ok()) return Fail(st.status());
    store = std::move(*st);
  }
  Receivers rx;
  auto cleanup = [&] {
    for (size_t i = 0; i < rx.stubs.size(); ++i) {
      grpc::ClientContext ctx;
      rpc::SetDeadline(&ctx, 5);
      v1::StopRequest req;
      v1::StopResponse resp;
      rx.stubs[i]->Stop(&ctx, req, &resp);
    }
    for (pid_t pid : rx.pids) TerminateProcess(pid, 10);
    (void)RemoveTree(dir);  // best effort: a leftover temporary directory is harmless
  };
  for (int r = 1; r <= receivers; ++r) {
    std::vector<std::string> argv = {SelfExecutable(), "bench",
                                     "weight-sync",    "--serve-receiver",
                                     "--dir",          dir,
                                     "--rank",         std::to_string(r),
                                     "--world",        std::to_string(receivers + 1),
                                     "--deadline-s",   std::to_string(deadline_s)};
    if (store) {
      argv.push_back("--store");
      argv.push_back(store->address());
    }
    auto pid = SpawnProcess(argv, dir + "/receiver-" + std::to_string(r) + ".log");
    if (!pid.ok()) {
      cleanup();
      return Fail(pid.status());
    }
    rx.pids.push_back(*pid);
  }
  const auto wait_until = comm::DeadlineAfter(60);
  for (int r = 1; r <= receivers; ++r) {
    const std::string file = dir + "/receiver-" + std::to_string(r) + ".addr";
    while (!PathExists(file)) {
      int status;
      if (PollExit(rx.pids[r - 1], &status) || comm::SecondsLeft(wait_until) < 0) {
        const std::string log = ReadSmallFile(dir + "/receiver-" + std::to_string(r) + ".log");
        rx.pids.erase(rx.pids.begin() + (r - 1));
        cleanup();
        return Fail(Unavailable("receiver " + std::to_string(r) + " did not start: " + log));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    rx.addresses.push_back(ReadSmallFile(file));
    rx.stubs.push_back(v1::Rollout::NewStub(UnlimitedChannel(rx.addresses.back())));
  }
  std::unique_ptr<comm::Communicator> gloo;
  if (use_gloo) {
    comm::GlooOptions o;
    o.store_address = store->address();
    o.group = "bench";
    o.rank = 0;
    o.size = static_cast<int>(receivers + 1);
    auto c = comm::CreateGlooCommunicator(o);
    if (!c.ok()) {
      cleanup();
      return Fail(c.status());
    }
    gloo = std::move(*c);
  }

  // One row: a warm-up, then `reps` timed transfers, each its own policy version.
  BenchReport report("weight-sync");
  report.SetKeys({"transport", "bucket_mb", "receivers"});
  report.SetMetric("seconds", false);
  report.SetMetric("gb_per_s", true);
  report.SetMetric("speedup", true);
  report.SetContext("payload_bytes", size);
  report.SetContext("receivers", receivers);
  report.SetContext("reps", reps);
  report.SetContext("host_cpus", static_cast<int64_t>(std::thread::hardware_concurrency()));
  report.SetContext("baseline", "grpc-naive: one unbucketed gRPC message of the whole payload");
  double baseline_s = 0;
  auto run_row = [&](const std::string& transport, int64_t bucket_bytes) -> Status {
    std::vector<double> times;
    for (int64_t rep = 0; rep <= reps; ++rep) {
      payload.version += 1;
      const auto t0 = std::chrono::steady_clock::now();
      if (transport == "gloo") {
        auto r = comm::PublishWeights(gloo.get(), payload, bucket_bytes,
                                      comm::DeadlineAfter(deadline_s));
        if (!r.ok()) return r.status().WithContext("gloo publish");
      } else if (transport == "cuda_ipc") {
        GYRE_RETURN_IF_ERROR(SendCudaIpcToAll(&rx, *ipc_params, *ipc_published, ipc_handle,
                                              payload.version, bucket_bytes, deadline_s));
      } else {
        GYRE_RETURN_IF_ERROR(SendGrpcToAll(&rx, payload, bucket_bytes, deadline_s));
      }
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "weight-sync: %-10s bucket %9s  %s %.3f s\n", transport.c_str(),
                   transport == "grpc-naive"
                       ? "whole"
                       : (std::to_string(bucket_bytes >> 20) + " MiB").c_str(),
                   rep == 0 ? "warm-up" : "rep    ", secs);
      if (rep > 0) times.push_back(secs);
    }
    const double median = Median(times);
    if (transport == "grpc-naive") baseline_s = median;
    nlohmann::json row = {
        {"transport", transport},
        {"bucket_mb",
         transport == "grpc-naive" ? nlohmann::json(nullptr) : nlohmann::json(bucket_bytes >> 20)},
        {"receivers", receivers},
        {"bytes", size},
        {"seconds", median},
        {"min_seconds", *std::min_element(times.begin(), times.end())},
        {"gb_per_s", size / median / 1e9},
        {"speedup", baseline_s / median}};
    report.AddRow(row);
    return Status::Ok();
  };
  Status status = run_row("grpc-naive", static_cast<int64_t>(std::max<uint64_t>(size, 1)));
  for (int64_t mib : bucket_mib) {
    if (status.ok() && use_grpc) status = run_row("grpc", mib << 20);
    if (status.ok() && use_gloo) status = run_row("gloo", mib << 20);
    if (status.ok() && use_cuda_ipc) status = run_row("cuda_ipc", mib << 20);
  }
  if (gloo && !gloo->aborted()) {
    Status end = comm::PublishEndOfStream(gloo.get(), comm::DeadlineAfter(30));
    if (!end.ok() && status.ok()) status = end;
  }
  gloo.reset();
  cleanup();
  if (!status.ok()) return Fail(status);

  report.PrintTable({{"transport", "transport", 0},
                     {"bucket_mb", "bucket MiB", 0},
                     {"receivers", "receivers", 0},
                     {"seconds", "seconds", 3},
                     {"gb_per_s", "GB/s", 3},
                     {"speedup", "speedup", 2}});
  if (!json_path.empty()) {
    if (Status s = report.WriteJson(json_path); !s.ok()) return Fail(s);
  }
  return 0;
}

}  // namespace gyre::bench
