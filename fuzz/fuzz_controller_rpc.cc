// Fuzzes the controller's RPC handlers (src/controller/controller_service.cc) with a real
// ControllerService: each input is a sequence of records (fuzz_util.h RecordReader), each one a
// request protobuf parsed with ParseFromString and handed to the handler, mixed with the job
// thread's calls that change what the handlers see (a worker marked dead, expected again, expired,
// a stop for all). A fresh service per input expects rollout-0, rollout-1 and trainer-0.
//
// Record tags (mod 8): 0 Register, 1 Heartbeat, 2 Shutdown (payload: the request), 3 MarkDead,
// 4 ExpectAgain (payload's first byte picks the worker), 5 ExpireSilent, 6 RequestStopAll,
// 7 Snapshot and WaitAllRegistered. The handlers do not read their ServerContext; each call gets
// a fresh default one, as on a server.

#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/logging.h"
#include "controller/controller_service.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/rpc_call.h"
#include "gyre/v1/gyre.pb.h"

namespace {

const char* const kWorkers[] = {"rollout-0", "rollout-1", "trainer-0"};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gyre::InitLogging("fuzz", "off");
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 in a string field is logged
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using gyre::controller::ControllerService;
  namespace v1 = gyre::v1;
  ControllerService service("job:\n  name: fuzz\n", 1.0, 5.0);
  service.Expect("rollout-0", v1::WORKER_ROLE_ROLLOUT, 0, 101);
  service.Expect("rollout-1", v1::WORKER_ROLE_ROLLOUT, 1, 102);
  service.Expect("trainer-0", v1::WORKER_ROLE_TRAINER, 0, 103);
  gyre::fuzz::RecordReader records(data, size);
  uint8_t tag;
  std::string payload;
  for (int n = 0; n < 64 && records.Next(&tag, &payload); ++n) {
    const char* worker = kWorkers[payload.empty() ? 0 : static_cast<uint8_t>(payload[0]) % 3];
    switch (tag % 8) {
      case 0:
        gyre::fuzz::CallHandler<v1::RegisterRequest, v1::RegisterResponse>(
            &service, &ControllerService::Register, payload);
        break;
      case 1:
        gyre::fuzz::CallHandler<v1::HeartbeatRequest, v1::HeartbeatResponse>(
            &service, &ControllerService::Heartbeat, payload);
        break;
      case 2:
        gyre::fuzz::CallHandler<v1::ShutdownRequest, v1::ShutdownResponse>(
            &service, &ControllerService::Shutdown, payload);
        break;
      case 3:
        service.MarkDead(worker, "killed by the fuzzer");
        break;
      case 4:
        service.ExpectAgain(worker, 200);
        break;
      case 5:
        (void)service.ExpireSilent();
        break;
      case 6:
        service.RequestStopAll();
        break;
      default:
        (void)service.Snapshot();
        (void)service.WaitAllRegistered(0, [] { return true; });
        (void)service.fatal_report();
        break;
    }
  }
  return 0;
}
