// Fuzzes a rollout worker's RPC handlers (src/rollout/rollout_service.cc) with a real
// RolloutService around a tiny model (model_fixtures.h), fresh for each input. The input is a
// sequence of records (fuzz_util.h RecordReader); each payload is parsed with ParseFromString as
// the request and handed to the handler.
//
// Record tags (mod 5):
//   0 Generate: the engine runs the request for real. Requests over a work budget (more than 16
//     groups plus resumed samples, or more than 32 samples) are skipped: they are valid, just slow.
//   1 ReceiveWeights, with store_address cleared, so a gloo or nccl request fails where it would
//     otherwise connect to a rendezvous store (nccl and cuda_ipc fail earlier on a CPU model).
//   2 Stop.
//   3 one WeightChunk of a LoadWeights stream, 4 the end of that stream (also implied at the
//     end of the input). LoadWeights itself takes a grpc::ServerReader, which only a live server
//     can make, so the stream goes to what LoadWeights calls with it, comm::ReceiveWeights (chunk
//     checks, then LoadFlatParameters), with a model of the same shape.

#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/weight_sync.h"
#include "common/check.h"
#include "common/logging.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/model_fixtures.h"
#include "fuzz/rpc_call.h"
#include "gyre/v1/gyre.grpc.pb.h"
#include "rollout/rollout_service.h"

namespace {

namespace v1 = gyre::v1;

// A LoadWeights stream from recorded chunks.
class ChunkReader final : public grpc::ServerReaderInterface<v1::WeightChunk> {
 public:
  explicit ChunkReader(const std::vector<v1::WeightChunk>* chunks) : chunks_(chunks) {}
  void SendInitialMetadata() override {}
  bool NextMessageSize(uint32_t* sz) override {
    if (next_ == chunks_->size()) return false;
    *sz = static_cast<uint32_t>((*chunks_)[next_].ByteSizeLong());
    return true;
  }
  bool Read(v1::WeightChunk* msg) override {
    if (next_ == chunks_->size()) return false;
    *msg = (*chunks_)[next_++];
    return true;
  }

 private:
  const std::vector<v1::WeightChunk>* chunks_;
  size_t next_ = 0;
};

bool OverBudget(const v1::GenerateRequest& req) {
  if (req.groups_size() + req.resume_size() > 16) return true;
  int64_t samples = req.resume_size();
  for (const auto& g : req.groups()) samples += std::max<int64_t>(g.n(), 0);
  return samples > 32;
}

std::unique_ptr<gyre::model::Transformer>* g_receiver = nullptr;

void FinishStream(std::vector<v1::WeightChunk>* chunks) {
  if (chunks->empty()) return;
  ChunkReader reader(chunks);
  v1::WeightReceipt receipt;
  (void)gyre::comm::ReceiveWeights(&reader, (*g_receiver)->NamedParameters(), &receipt);
  chunks->clear();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gyre::InitLogging("fuzz", "off");
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 in a string field is logged
  g_receiver = new std::unique_ptr<gyre::model::Transformer>(gyre::fuzz::MakeFuzzModel(9));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto created = gyre::rollout::RolloutService::Create(
      gyre::fuzz::MakeFuzzModel(), gyre::fuzz::FuzzEngineConfig(), gyre::fuzz::FuzzDecoder(),
      [](const std::string&) {});
  GYRE_CHECK(created.ok()) << created.status();
  gyre::rollout::RolloutService& service = **created;
  std::vector<v1::WeightChunk> chunks;
  gyre::fuzz::RecordReader records(data, size);
  uint8_t tag;
  std::string payload;
  using gyre::fuzz::CallHandler;
  using gyre::rollout::RolloutService;
  for (int n = 0; n < 64 && records.Next(&tag, &payload); ++n) {
    switch (tag % 5) {
      case 0:
        CallHandler<v1::GenerateRequest, v1::GenerateResponse>(
            &service, &RolloutService::Generate, payload,
            [](v1::GenerateRequest* r) { return !OverBudget(*r); });
        break;
      case 1:
        CallHandler<v1::ReceiveWeightsRequest, v1::WeightReceipt>(
            &service, &RolloutService::ReceiveWeights, payload, [](v1::ReceiveWeightsRequest* r) {
              r->clear_store_address();
              return true;
            });
        break;
      case 2:
        CallHandler<v1::StopRequest, v1::StopResponse>(&service, &RolloutService::Stop, payload);
        break;
      case 3: {
        v1::WeightChunk chunk;
        if (chunk.ParseFromString(payload) && chunks.size() < 64) chunks.push_back(chunk);
        break;
      }
      default:
        FinishStream(&chunks);
        break;
    }
  }
  FinishStream(&chunks);
  return 0;
}
