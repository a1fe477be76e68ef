// Fuzzes a trainer worker's RPC handlers (src/trainer/trainer_service.cc) with a real
// TrainerService around a tiny model (model_fixtures.h), fresh for each input. The input is a
// sequence of records (fuzz_util.h RecordReader); each payload is parsed with ParseFromString as
// the request and handed to the handler.
//
// Record tags (mod 10):
//   0 TrainStep: a real optimizer step. Requests of more than 16 samples or 1024 token ids are
//     skipped (valid, just slow).
//   1 PublishWeights: requests that would connect to rollout workers are kept from the network:
//     store_address is cleared (gloo and nccl then fail before forming groups), and a grpc publish
//     to one or more addresses is skipped.
//   2 JoinGroup, with store_address cleared: the rank checks run, then the Gloo options' checks,
//     then it fails where it would connect.
//   3 Stop.
//   4 Save, 5 SaveState, 6 LoadState: the directory the request names is kept inside a scratch
//     directory (its last 12 letters and digits become a subdirectory's name; an empty one
//     stays empty), so what a Save or SaveState writes, a later LoadState of the same name reads.
//   7 HostGroupStore (binds an OS-chosen loopback port).
//   8 SequenceKl: forwards of the policy and (frozen at the first call) reference policy; the
//     same sample budget as TrainStep.
//   9 AbortWeightTransfer (its effect is on a later publish, which tag 1 runs).
// The trainer-state reader itself gets arbitrary files from fuzz_trainer_state.

#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/logging.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/model_fixtures.h"
#include "fuzz/rpc_call.h"
#include "gyre/v1/gyre.grpc.pb.h"
#include "trainer/trainer_service.h"

namespace {

namespace v1 = gyre::v1;

std::string* g_scratch = nullptr;

// The request's directory, confined to the scratch directory.
std::string Confined(const std::string& directory) {
  if (directory.empty()) return directory;
  std::string name;
  for (char c : directory) {
    if (std::isalnum(static_cast<unsigned char>(c))) name += c;
  }
  if (name.size() > 12) name.erase(0, name.size() - 12);
  return *g_scratch + "/d" + name;
}

template <typename Request>
bool OverBudget(const Request& req) {
  if (req.samples_size() > 16) return true;
  int64_t ids = 0;
  for (const auto& s : req.samples()) ids += s.prompt_ids_size() + s.response_ids_size();
  return ids > 1024;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gyre::InitLogging("fuzz", "off");
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 in a string field is logged
  g_scratch = new std::string(gyre::fuzz::ScratchDir("trainer_rpc"));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto made = gyre::trainer::TrainerService::Create(
      gyre::fuzz::FuzzTrainerJobConfig(), gyre::fuzz::MakeFuzzModel(), [](const std::string&) {});
  if (!made.ok()) __builtin_trap();  // the fixture's job must resolve
  gyre::trainer::TrainerService& service = **made;
  gyre::fuzz::RecordReader records(data, size);
  uint8_t tag;
  std::string payload;
  using gyre::fuzz::CallHandler;
  using gyre::trainer::TrainerService;
  auto confine = [](auto* r) {
    r->set_directory(Confined(r->directory()));
    return true;
  };
  for (int n = 0; n < 32 && records.Next(&tag, &payload); ++n) {
    switch (tag % 10) {
      case 0:
        CallHandler<v1::TrainStepRequest, v1::TrainStepResponse>(
            &service, &TrainerService::TrainStep, payload,
            [](v1::TrainStepRequest* r) { return !OverBudget(*r); });
        break;
      case 1:
        CallHandler<v1::PublishWeightsRequest, v1::PublishWeightsResponse>(
            &service, &TrainerService::PublishWeights, payload, [](v1::PublishWeightsRequest* r) {
              r->clear_store_address();
              const bool grpc = r->transport().empty() || r->transport() == "grpc";
              return !(grpc && r->rollout_addresses_size() > 0 &&
                       r->rollout_addresses_size() == r->rollout_ids_size());
            });
        break;
      case 2:
        CallHandler<v1::JoinGroupRequest, v1::JoinGroupResponse>(
            &service, &TrainerService::JoinGroup, payload, [](v1::JoinGroupRequest* r) {
              r->clear_store_address();
              return true;
            });
        break;
      case 3:
        CallHandler<v1::StopRequest, v1::StopResponse>(&service, &TrainerService::Stop, payload);
        break;
      case 4:
        CallHandler<v1::SaveRequest, v1::SaveResponse>(&service, &TrainerService::Save, payload,
                                                       confine);
        break;
      case 5:
        CallHandler<v1::SaveStateRequest, v1::SaveStateResponse>(
            &service, &TrainerService::SaveState, payload, confine);
        break;
      case 6:
        CallHandler<v1::LoadStateRequest, v1::LoadStateResponse>(
            &service, &TrainerService::LoadState, payload, confine);
        break;
      case 7:
        CallHandler<v1::HostGroupStoreRequest, v1::HostGroupStoreResponse>(
            &service, &TrainerService::HostGroupStore, payload);
        break;
      case 9:
        CallHandler<v1::AbortWeightTransferRequest, v1::AbortWeightTransferResponse>(
            &service, &TrainerService::AbortWeightTransfer, payload);
        break;
      default:
        CallHandler<v1::SequenceKlRequest, v1::SequenceKlResponse>(
            &service, &TrainerService::SequenceKl, payload,
            [](v1::SequenceKlRequest* r) { return !OverBudget(*r); });
        break;
    }
  }
  return 0;
}
