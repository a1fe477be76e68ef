#include "comm/weight_sender.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <string>
#include <utility>
#include <vector>

#include "comm/cuda_ipc.h"
#include "comm/gloo_communicator.h"
#include "comm/nccl_communicator.h"
#include "comm/sliced_payload.h"

namespace gyre::comm {

StatusOr<std::string> WeightSender::Transport(const v1::PublishWeightsRequest& req) {
  if (req.rollout_addresses_size() != req.rollout_ids_size()) {
    return InvalidArgument("rollout_addresses and rollout_ids differ in length");
  }
  const std::string transport = req.transport().empty() ? "grpc" : req.transport();
  if (transport != "grpc" && transport != "gloo" && transport != "nccl" &&
      transport != "cuda_ipc") {
    return InvalidArgument("unknown weight transport '" + transport +
                           "' (grpc, gloo, nccl or cuda_ipc)");
  }
  return transport;
}

int64_t WeightSender::BucketBytes(const v1::PublishWeightsRequest& req) {
  return req.bucket_bytes() > 0 ? req.bucket_bytes() : (4 << 20);
}

double WeightSender::TimeoutSeconds(const v1::PublishWeightsRequest& req) {
  return req.timeout_s() > 0 ? req.timeout_s() : 60.0;
}

Status WeightSender::PublishHost(const v1::PublishWeightsRequest& req, const WeightPayload& payload,
                                 v1::PublishWeightsResponse* resp) {
  GYRE_ASSIGN_OR_RETURN(const std::string transport, Transport(req));
  if (transport == "gloo") return PublishToGroups(req, &payload, nullptr, resp);
  if (transport != "grpc") {
    return InvalidArgument(transport + " sends from device memory, not from a host payload");
  }
  // One cancellation per receiver, so that AbortReceivers can end that stream alone.
  std::vector<std::unique_ptr<rpc::Cancellation>> owned;
  std::vector<rpc::Cancellation*> cancels;
  BeginPublish(req.publish_id());
  for (const std::string& id : req.rollout_ids()) {
    owned.push_back(std::make_unique<rpc::Cancellation>());
    cancels.push_back(owned.back().get());
    Track(id, owned.back().get());
  }
  SendToEach(payload, req.rollout_addresses(), req.rollout_ids(), BucketBytes(req),
             TimeoutSeconds(req), resp, &cancels);
  EndPublish();
  return Status::Ok();
}

int WeightSender::AbortReceivers(uint64_t publish_id, const std::vector<std::string>& rollout_ids) {
  if (publish_id == 0) return 0;
  std::lock_guard<std::mutex> lock(abort_mu_);
  int ended = 0;
  for (const std::string& id : rollout_ids) {
    abort_requests_.insert({publish_id, id});
    if (publish_id != publishing_) continue;
    if (auto [g, end] = live_groups_.equal_range(id); g != end) {
      for (; g != end; ++g) g->second->Abort();
      ++ended;
    } else if (auto st = live_streams_.find(id); st != live_streams_.end()) {
      st->second->Cancel();
      ++ended;
    }
  }
  return ended;
}

void WeightSender::BeginPublish(uint64_t publish_id) {
  std::lock_guard<std::mutex> lock(abort_mu_);
  publishing_ = publish_id;
  live_groups_.clear();
  live_streams_.clear();
  // Only requests for this publish can still apply (one may arrive before the publish does).
  for (auto it = abort_requests_.begin(); it != abort_requests_.end();) {
    it = it->first == publish_id && publish_id != 0 ? std::next(it) : abort_requests_.erase(it);
  }
}

void WeightSender::EndPublish() {
  std::lock_guard<std::mutex> lock(abort_mu_);
  publishing_ = 0;
  live_groups_.clear();
  live_streams_.clear();
  abort_requests_.clear();
}

bool WeightSender::AbortRequested(const std::string& rollout_id) {
  std::lock_guard<std::mutex> lock(abort_mu_);
  return abort_requests_.count({publishing_, rollout_id}) > 0;
}

void WeightSender::Track(const std::string& rollout_id, Communicator* group) {
  std::lock_guard<std::mutex> lock(abort_mu_);
  live_groups_.emplace(rollout_id, group);
  if (abort_requests_.count({publishing_, rollout_id})) group->Abort();
}

void WeightSender::Track(const std::string& rollout_id, rpc::Cancellation* stream) {
  std::lock_guard<std::mutex> lock(abort_mu_);
  live_streams_[rollout_id] = stream;
  if (abort_requests_.count({publishing_, rollout_id})) stream->Cancel();
}

Status WeightSender::PublishDevice(const v1::PublishWeightsRequest& req,
                                   const DevicePayload& payload, v1::PublishWeightsResponse* resp) {
  GYRE_ASSIGN_OR_RETURN(const std::string transport, Transport(req));
  if (transport == "nccl") return PublishToGroups(req, nullptr, &payload, resp);
  if (transport != "cuda_ipc") {
    return InvalidArgument(transport + " sends from host memory, not from a device payload");
  }
  if (staging_ == nullptr || payload.data != staging_->data()) {
    return FailedPrecondition("a cuda_ipc publish must send from the staging buffer");
  }
  // The receivers copy from the buffer; the controller checks their receipts against these.
  const int64_t bucket = BucketBytes(req);
  GYRE_ASSIGN_OR_RETURN(auto crcs,
                        DeviceBucketCrc32(payload.data, payload.bytes, bucket, payload.device,
                                          DeadlineAfter(TimeoutSeconds(req))));
  resp->set_ipc_handle(ipc_handle_);
  resp->set_total_bytes(payload.bytes);
  resp->set_bucket_bytes(bucket);
  for (uint32_t c : crcs) resp->add_bucket_crc32(c);
  ManifestToProto(payload.manifest, resp->mutable_manifest());
  return Status::Ok();
}

StatusOr<void*> WeightSender::StagingBuffer(uint64_t bytes, int device) {
  bool reallocated = false;
  GYRE_RETURN_IF_ERROR(EnsureDeviceBuffer(bytes, device, &staging_, &reallocated));
  if (reallocated || ipc_handle_.empty()) {
    GYRE_ASSIGN_OR_RETURN(ipc_handle_, ExportCudaIpcHandle(staging_->data()));
  }
  return staging_->data();
}

std::string WeightSender::MemberGroup(const v1::PublishWeightsRequest& req, int receiver,
                                      int rank) {
  return ReceiverRanks(req) > 1 ? TensorParallelWeightGroup(req.groups(receiver), rank)
                                : req.groups(receiver);
}

int WeightSender::ReceiverRanks(const v1::PublishWeightsRequest& req) {
  return std::max(1, req.receiver_tensor_parallel());
}

Status WeightSender::PublishToGroups(const v1::PublishWeightsRequest& req,
                                     const WeightPayload* host_payload,
                                     const DevicePayload* device_payload,
                                     v1::PublishWeightsResponse* resp) {
  const std::string transport = req.transport();
  if (req.groups_size() != req.rollout_ids_size() || req.store_address().empty()) {
    return InvalidArgument(transport +
                           " publish needs a store address and one group per rollout worker");
  }
  // A tensor-parallel receiver is `ranks` members, each in a group of its own with this sender.
  const int ranks = ReceiverRanks(req);
  if (ranks > 1 && host_payload == nullptr) {
    return InvalidArgument("tensor-parallel rollout workers receive their slices over gloo, not " +
                           transport);
  }
  const double timeout = TimeoutSeconds(req);
  const Deadline deadline = DeadlineAfter(timeout);
  const int n = req.groups_size();
  const int members = n * ranks;  // member m: rank m % ranks of receiver m / ranks
  BeginPublish(req.publish_id());
  // Groups not named any more belong to receivers that are gone.
  std::map<std::string, std::unique_ptr<Communicator>> keep;
  for (int m = 0; m < members; ++m) {
    auto it = groups_.find(MemberGroup(req, m / ranks, m % ranks));
    if (it != groups_.end() && !it->second->aborted()) keep[it->first] = std::move(it->second);
  }
  groups_ = std::move(keep);
  // Groups given up on while forming, once their attempt has ended.
  abandoned_.erase(std::remove_if(abandoned_.begin(), abandoned_.end(),
                                  [](const auto& f) {
                                    return f.wait_for(std::chrono::seconds(0)) ==
                                           std::future_status::ready;
                                  }),
                   abandoned_.end());
  // Form the missing groups concurrently: each waits for its receiver to join.
  std::vector<Status> formed(members);
  std::vector<std::future<StatusOr<std::unique_ptr<Communicator>>>> joining(members);
  for (int m = 0; m < members; ++m) {
    const std::string group = MemberGroup(req, m / ranks, m % ranks);
    if (groups_.count(group)) continue;
    const std::string store = req.store_address();
    if (transport == "nccl") {
      const int device = device_payload->device;
      joining[m] =
          std::async(std::launch::async,
                     [group, store, device, timeout]() -> StatusOr<std::unique_ptr<Communicator>> {
                       // The unique id names a bootstrap socket in this process; the receiver reads
                       // it from the controller's store.
                       GYRE_ASSIGN_OR_RETURN(std::string id, NewNcclUniqueId());
                       GYRE_RETURN_IF_ERROR(StoreSet(store, group + "/nccl_id", id, timeout));
                       NcclOptions o;
                       o.unique_id = id;
                       o.rank = 0;
                       o.size = 2;
                       o.device = device;
                       o.connect_timeout_s = timeout;
                       return CreateNcclCommunicator(o);
                     });
      continue;
    }
    GlooOptions o;
    o.store_address = store;
    o.group = group;
    o.rank = 0;
    o.size = 2;
    if (!req.bind_host().empty()) o.bind_host = req.bind_host();
    o.connect_timeout_s = timeout;
    joining[m] = std::async(std::launch::async, [o] { return CreateGlooCommunicator(o); });
  }
  std::vector<Communicator*> groups;
  std::vector<int> index;  // groups[k] serves member index[k]
  for (int m = 0; m < members; ++m) {
    const std::string& id = req.rollout_ids(m / ranks);
    const std::string group = MemberGroup(req, m / ranks, m % ranks);
    if (joining[m].valid()) {
      // Waits for the receiver to join, unless its transfer is ended first (AbortReceivers).
      bool ready = false;
      while (!(ready = joining[m].wait_for(std::chrono::milliseconds(50)) ==
                       std::future_status::ready) &&
             !AbortRequested(id)) {
      }
      if (!ready) {
        formed[m] = Aborted("the transfer to " + id + " was ended while its group formed");
        abandoned_.push_back(std::move(joining[m]));  // it ends by its connect timeout
        continue;
      }
      auto c = joining[m].get();
      if (!c.ok()) {
        formed[m] = c.status();
        continue;
      }
      groups_[group] = std::move(*c);
    }
    groups.push_back(groups_.at(group).get());
    index.push_back(m);
    Track(id, groups.back());
  }
  const int64_t bucket = BucketBytes(req);
  std::vector<FanoutResult> results;
  if (device_payload != nullptr) {
    results = PublishDeviceToEach(groups, *device_payload, bucket, deadline);
  } else if (ranks == 1) {
    // A streamed payload was made for n readers; those without a group read nothing.
    if (host_payload->stream) {
      for (int k = static_cast<int>(groups.size()); k < n; ++k) host_payload->stream->Finish(k);
    }
    results = PublishToEach(groups, *host_payload, bucket, deadline);
  } else {
    // Each member its own slices, made from the whole payload as that member's reader (a
    // streamed one was made for n * ranks readers, member m reading as m).
    std::vector<WeightPayload> sliced(groups.size());
    std::vector<const WeightPayload*> payloads;
    std::vector<Communicator*> sending;
    std::vector<int> sending_index;
    std::vector<bool> reading(members, false);  // members whose slices are sent
    for (size_t k = 0; k < groups.size(); ++k) {
      const int m = index[k];
      auto s = SlicedPayload(*host_payload, m, m % ranks, ranks);
      if (!s.ok()) {
        formed[m] = s.status();
        groups[k]->Abort();  // dropped below, which closes it: the rank is not left waiting
        continue;
      }
      sliced[k] = std::move(*s);
      payloads.push_back(&sliced[k]);
      sending.push_back(groups[k]);
      sending_index.push_back(m);
      reading[m] = true;
    }
    if (host_payload->stream) {
      for (int m = 0; m < members; ++m) {
        if (!reading[m]) host_payload->stream->Finish(m);
      }
    }
    results = PublishEachItsOwn(sending, payloads, bucket, deadline, [&](int k) {
      if (host_payload->stream) host_payload->stream->Finish(sending_index[k]);
    });
    index = std::move(sending_index);
  }
  EndPublish();  // before a failed group below is destroyed
  std::vector<const FanoutResult*> by_member(members, nullptr);
  for (size_t k = 0; k < results.size(); ++k) by_member[index[k]] = &results[k];
  for (int i = 0; i < n; ++i) {
    v1::PublishResult* pr = resp->add_results();
    pr->set_rollout_id(req.rollout_ids(i));
    // The receiver's outcome is its first failed rank's, and its checksums every rank's in order.
    Status s;
    for (int r = 0; r < ranks && s.ok(); ++r) {
      const int m = i * ranks + r;
      s = by_member[m] ? by_member[m]->status : formed[m];
      if (!s.ok() && ranks > 1) {
        s = s.WithContext("tensor-parallel rank " + std::to_string(r) + " of " +
                          req.rollout_ids(i));
      }
    }
    pr->set_ok(s.ok());
    if (s.ok()) {
      for (int r = 0; r < ranks; ++r) {
        for (uint32_t c : by_member[i * ranks + r]->result.bucket_crc32) pr->add_sent_crc32(c);
      }
    } else {
      pr->set_error(s.ToString());
      for (int r = 0; r < ranks; ++r) groups_.erase(MemberGroup(req, i, r));
    }
  }
  return Status::Ok();
}

}  // namespace gyre::comm
