#include "rollout/tensor_parallel_weights.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "comm/gloo_communicator.h"
#include "comm/sliced_payload.h"

namespace gyre::rollout {
namespace {

// Per tensor, in the order rank 0 sends them, what the other ranks need to receive it: dtype
// code, rank, the two extents (1 for a vector's second), bytes, which of the slices it is, the
// dimension it is split along (-1: it comes whole, broadcast) and the extent of each rank's part
// along it (scattered: a rank receives only its part).
constexpr int64_t kDescriptor = 8;

// Rank 0's word before each tensor and after the last one.
constexpr int64_t kRefused = -1;     // instead of the count: nothing comes
constexpr int64_t kTensor = 1;       // a tensor follows
constexpr int64_t kComplete = 2;     // every tensor was sent and the transfer passed its checks
constexpr int64_t kIncomplete = -2;  // the transfer failed: nothing is loaded

int64_t DtypeCode(at::ScalarType t) { return t == at::kFloat ? 0 : t == at::kBFloat16 ? 1 : 2; }
at::ScalarType CodeDtype(int64_t c) {
  return c == 0 ? at::kFloat : c == 1 ? at::kBFloat16 : at::kHalf;
}

// Rank `rank`'s slice of a whole tensor of shape `whole`: empty when that does not split.
std::vector<int64_t> SliceShape(const std::string& name, std::vector<int64_t> whole, int rank,
                                int size) {
  const int d = model::TensorParallelDim(name);
  if (d >= 0 && d < static_cast<int>(whole.size())) {
    if (!model::TensorParallelSplits(name, whole[d], size)) return {};
    const auto [begin, end] = model::TensorParallelRange(name, whole[d], rank, size);
    whole[d] = end - begin;
  }
  return whole;
}

// How rank 0 hands a tensor of shape `whole` (which splits) to the group: {dim, part extent}
// for a split one, scattered in `size` equal parts (rank 0's slice is the largest: the
// vocabulary's last parts are padded to it), {-1, 0} for a replicated one, broadcast whole.
std::pair<int64_t, int64_t> Split(const std::string& name, const std::vector<int64_t>& whole,
                                  int size) {
  const int d = model::TensorParallelDim(name);
  if (size == 1 || d < 0 || d >= static_cast<int>(whole.size())) return {-1, 0};
  const auto [begin, end] = model::TensorParallelRange(name, whole[d], 0, size);
  return {d, end - begin};
}

// Rank 0's whole tensor as the parts a scatter sends: [size, ...part shape].
at::Tensor Parts(const std::string& name, const at::Tensor& whole, int64_t dim, int64_t extent,
                 int size) {
  std::vector<int64_t> shape = {size};
  for (int64_t e : whole.sizes()) shape.push_back(e);
  shape[static_cast<size_t>(dim) + 1] = extent;
  if (dim == 0 && whole.size(0) == extent * size) return whole.view(shape);  // rows: as they are
  at::Tensor parts = at::zeros(shape, whole.options());
  for (int r = 0; r < size; ++r) {
    const auto [begin, end] = model::TensorParallelRange(name, whole.size(dim), r, size);
    if (end > begin)
      parts[r].narrow(dim, 0, end - begin).copy_(whole.narrow(dim, begin, end - begin));
  }
  return parts;
}

// Rank `rank`'s slice out of its (padded) part.
void CopyPart(const std::string& name, const at::Tensor& part, int64_t dim, int64_t whole_extent,
              int rank, int size, const at::Tensor& param) {
  c10::InferenceMode guard;
  const auto [begin, end] = model::TensorParallelRange(name, whole_extent, rank, size);
  param.detach().copy_(part.narrow(dim, 0, end - begin));
}

std::string ShapeText(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void CopySlice(const std::string& name, const at::Tensor& whole, int rank, int size,
               const at::Tensor& param) {
  c10::InferenceMode guard;
  param.detach().copy_(model::TensorParallelSliceOf(name, whole, rank, size));
}

at::Tensor Count(int64_t n) { return at::full({1}, n, at::TensorOptions().dtype(at::kLong)); }

int64_t BroadcastCount(model::TensorParallelGroup* group, int64_t n) {
  at::Tensor t = Count(n);
  group->Broadcast(t, 0);
  return t.data_ptr<int64_t>()[0];
}

// Every rank says whether it holds the whole version in its staging; when all do, each loads it
// into its parameters. The ranks that did not, or "" when all did.
std::string AgreeAndLoad(bool complete, const std::vector<at::Tensor>& staging,
                         const model::NamedTensors& slices, model::TensorParallelGroup* group) {
  const std::string ranks = model::TensorParallelRanksNotOk(group, complete);
  if (!ranks.empty()) return ranks;
  c10::InferenceMode guard;
  for (size_t i = 0; i < slices.size(); ++i) slices[i].second.detach().copy_(staging[i]);
  return "";
}

std::vector<at::Tensor> Staging(const model::NamedTensors& slices) {
  std::vector<at::Tensor> out;
  c10::InferenceMode guard;
  for (const auto& [name, t] : slices) out.push_back(at::empty_like(t.detach()));
  return out;
}

}  // namespace

SliceSender::SliceSender(const model::NamedTensors& slices, model::TensorParallelGroup* group)
    : slices_(slices), group_(group) {}

Status SliceSender::Begin(const std::vector<model::TensorEntry>& manifest, uint64_t payload_bytes) {
  const int rank = group_->rank(), size = group_->size();
  if (manifest.size() != slices_.size()) {
    return InvalidArgument("the version has " + std::to_string(manifest.size()) +
                           " tensors, the model " + std::to_string(slices_.size()));
  }
  manifest_ = manifest;
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < manifest_.size(); ++i) by_name[manifest_[i].name] = i;
  std::vector<Pending> order;
  for (size_t k = 0; k < slices_.size(); ++k) {
    const auto& [name, param] = slices_[k];
    auto it = by_name.find(name);
    if (it == by_name.end()) return InvalidArgument("the version has no tensor " + name);
    const model::TensorEntry& e = manifest_[it->second];
    auto dtype = model::ParseWeightDtype(e.dtype);
    if (!dtype.ok()) return dtype.status().WithContext(name);
    int64_t numel = 1;
    for (int64_t d : e.shape) numel *= d;
    const uint64_t want = static_cast<uint64_t>(numel) * at::elementSize(*dtype);
    if (e.shape.empty() || e.shape.size() > 2 || e.nbytes != want || e.offset > payload_bytes ||
        e.nbytes > payload_bytes - e.offset) {
      return InvalidArgument(name + ": shape " + ShapeText(e.shape) + " with " +
                             std::to_string(e.nbytes) + " bytes at offset " +
                             std::to_string(e.offset) + " does not fit a payload of " +
                             std::to_string(payload_bytes) + " bytes");
    }
    const std::vector<int64_t> mine = SliceShape(name, e.shape, rank, size);
    if (mine.empty()) {
      return InvalidArgument(name + ": the version's " + ShapeText(e.shape) +
                             " does not split over " + std::to_string(size) +
                             " tensor-parallel ranks");
    }
    if (mine != param.sizes().vec()) {
      return InvalidArgument(name + ": the version's " + ShapeText(e.shape) + " slices to " +
                             ShapeText(mine) + " on rank 0, which holds " +
                             ShapeText(param.sizes().vec()));
    }
    order.push_back({k, &e, *dtype});
  }
  // Sent as the stream brings them: by offset, each tensor's bytes apart from the others'.
  std::sort(order.begin(), order.end(),
            [](const Pending& a, const Pending& b) { return a.entry->offset < b.entry->offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const model::TensorEntry& prev = *order[i - 1].entry;
    if (prev.offset + prev.nbytes > order[i].entry->offset) {
      return InvalidArgument(prev.name + " and " + order[i].entry->name +
                             " overlap in the version's payload");
    }
  }
  order_ = std::move(order);
  const int64_t n = static_cast<int64_t>(order_.size());
  BroadcastCount(group_, n);
  at::Tensor descriptors = at::zeros({n, kDescriptor}, at::TensorOptions().dtype(at::kLong));
  int64_t* d = descriptors.data_ptr<int64_t>();
  for (const Pending& p : order_) {
    const model::TensorEntry& e = *p.entry;
    d[0] = DtypeCode(p.dtype);
    d[1] = static_cast<int64_t>(e.shape.size());
    d[2] = e.shape[0];
    d[3] = e.shape.size() > 1 ? e.shape[1] : 1;
    d[4] = static_cast<int64_t>(e.nbytes);
    d[5] = static_cast<int64_t>(p.slice);
    const auto [dim, extent] = Split(slices_[p.slice].first, e.shape, size);
    d[6] = dim;
    d[7] = extent;
    d += kDescriptor;
  }
  group_->Broadcast(descriptors, 0);
  staging_ = Staging(slices_);
  begun_ = true;
  return Status::Ok();
}

void SliceSender::SendCurrent() {
  const Pending& p = order_[next_];
  if (!current_.defined()) current_ = at::empty(p.entry->shape, at::TensorOptions().dtype(p.dtype));
  BroadcastCount(group_, kTensor);
  const std::string& name = slices_[p.slice].first;
  const int size = group_->size();
  const auto [dim, extent] = Split(name, p.entry->shape, size);
  if (dim < 0) {
    group_->Broadcast(current_, 0);
    CopySlice(name, current_, 0, size, staging_[p.slice]);
  } else {
    at::Tensor parts = Parts(name, current_, dim, extent, size);
    at::Tensor mine = at::empty(parts.sizes().slice(1), parts.options());
    group_->Scatter(parts, mine, 0);
    CopyPart(name, mine, dim, current_.size(dim), 0, size, staging_[p.slice]);
  }
  current_ = at::Tensor();
  filled_ = 0;
  ++next_;
}

Status SliceSender::Add(uint64_t offset, const uint8_t* data, size_t size) {
  if (!begun_) return FailedPrecondition("SliceSender::Add before Begin");
  const uint64_t end = offset + size;
  while (next_ < order_.size()) {
    const model::TensorEntry& e = *order_[next_].entry;
    const uint64_t lo = std::max(offset, e.offset + filled_);
    const uint64_t hi = std::min(end, e.offset + e.nbytes);
    if (e.nbytes > 0 && lo >= hi) break;  // its next bytes are in a later part
    if (hi > lo) {
      if (!current_.defined()) {
        current_ = at::empty(e.shape, at::TensorOptions().dtype(order_[next_].dtype));
      }
      std::memcpy(static_cast<uint8_t*>(current_.data_ptr()) + (lo - e.offset),
                  data + (lo - offset), hi - lo);
      filled_ += hi - lo;
    }
    if (filled_ < e.nbytes) break;
    SendCurrent();
  }
  return Status::Ok();
}

Status SliceSender::Finish(const Status& transfer) {
  if (!begun_) {
    BroadcastCount(group_, kRefused);
    return transfer.ok() ? FailedPrecondition("the version's manifest never arrived") : transfer;
  }
  const bool complete = transfer.ok() && next_ == order_.size();
  BroadcastCount(group_, complete ? kComplete : kIncomplete);
  const std::string missing = AgreeAndLoad(complete, staging_, slices_, group_);
  staging_.clear();
  if (missing.empty()) return Status::Ok();
  if (!transfer.ok()) return transfer;
  if (!complete) {
    return DataLoss("the transfer ended after " + std::to_string(next_) + " of " +
                    std::to_string(order_.size()) + " tensors; nothing was loaded");
  }
  return Unavailable("tensor-parallel rank(s) " + missing +
                     " did not receive the whole version; nothing was loaded");
}

Status ReceiveSlices(const model::NamedTensors& slices, model::TensorParallelGroup* group) {
  const int rank = group->rank(), size = group->size();
  const int64_t n = BroadcastCount(group, 0);
  if (n < 0) {
    return FailedPrecondition("rank 0 refused the version (its error says why); nothing loaded");
  }
  at::Tensor descriptors = at::zeros({n, kDescriptor}, at::TensorOptions().dtype(at::kLong));
  group->Broadcast(descriptors, 0);
  Status result = Status::Ok();
  if (n != static_cast<int64_t>(slices.size())) {
    result = Internal("rank 0 sends " + std::to_string(n) + " tensors, rank " +
                      std::to_string(rank) + " holds " + std::to_string(slices.size()));
  }
  std::vector<at::Tensor> staging = Staging(slices);
  std::vector<bool> seen(slices.size(), false);
  int64_t received = 0, word = 0;
  // Every tensor is received, so that the ranks stay in step, even after a mismatch.
  while ((word = BroadcastCount(group, 0)) == kTensor) {
    if (received >= n) {
      throw std::runtime_error("rank 0 sent more tensors than it announced");
    }
    const int64_t* d = descriptors.data_ptr<int64_t>() + received * kDescriptor;
    ++received;
    std::vector<int64_t> shape = {d[2]};
    if (d[1] > 1) shape.push_back(d[3]);
    const int64_t dim = d[6];
    if (dim >= static_cast<int64_t>(shape.size()) ||
        (dim >= 0 && (d[7] < 0 || d[7] > shape[dim]))) {
      throw std::runtime_error("rank 0 described a part that its tensor cannot hold");
    }
    std::vector<int64_t> received_shape = shape;
    if (dim >= 0) received_shape[static_cast<size_t>(dim)] = d[7];
    at::Tensor part = at::empty(received_shape, at::TensorOptions().dtype(CodeDtype(d[0])));
    if (dim < 0) {
      group->Broadcast(part, 0);
    } else {
      group->Scatter(at::Tensor(), part, 0);
    }
    if (!result.ok()) continue;
    const int64_t k = d[5];
    if (k < 0 || k >= static_cast<int64_t>(slices.size()) || seen[static_cast<size_t>(k)]) {
      result = Internal("rank 0 sent tensor " + std::to_string(k) + " twice or out of range");
      continue;
    }
    seen[static_cast<size_t>(k)] = true;
    const auto& [name, param] = slices[static_cast<size_t>(k)];
    const std::vector<int64_t> mine = SliceShape(name, shape, rank, size);
    if (mine.empty() || mine != param.sizes().vec() ||
        Split(name, shape, size) != std::make_pair(dim, d[7])) {
      result = Internal(name + ": rank 0's " + ShapeText(shape) + " slices to " + ShapeText(mine) +
                        " on rank " + std::to_string(rank) + ", which holds " +
                        ShapeText(param.sizes().vec()));
      continue;
    }
    if (dim < 0) {
      CopySlice(name, part, rank, size, staging[static_cast<size_t>(k)]);
    } else {
      CopyPart(name, part, dim, shape[static_cast<size_t>(dim)], rank, size,
               staging[static_cast<size_t>(k)]);
    }
  }
  const bool complete = word == kComplete && result.ok() && received == n;
  const std::string missing = AgreeAndLoad(complete, staging, slices, group);
  if (missing.empty()) return Status::Ok();
  if (!result.ok()) return result;
  if (word != kComplete) {
    return Unavailable(
        "rank 0's transfer of the version failed (its error says why); nothing "
        "loaded");
  }
  return Unavailable("tensor-parallel rank(s) " + missing +
                     " did not receive the whole version; nothing loaded");
}

namespace {

// Rank 0's `bytes` to every rank (its length first).
std::string BroadcastString(model::TensorParallelGroup* group, const std::string& bytes) {
  const int64_t n = BroadcastCount(group, static_cast<int64_t>(bytes.size()));
  if (n < 0 || n > (int64_t{1} << 20)) throw std::runtime_error("rank 0 announced a bad route");
  at::Tensor t = at::zeros({n}, at::TensorOptions().dtype(at::kByte));
  if (group->rank() == 0 && n > 0) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  if (n > 0) group->Broadcast(t, 0);
  return std::string(reinterpret_cast<const char*>(t.data_ptr()), static_cast<size_t>(n));
}

}  // namespace

void AnnounceRoute(model::TensorParallelGroup* group, const DirectRoute* route) {
  std::string bytes;
  if (route != nullptr) {
    // Four length-prefixed strings (the timeout in text).
    for (const std::string& f :
         {route->store_address, route->group, route->bind_host, std::to_string(route->timeout_s)}) {
      const uint32_t n = static_cast<uint32_t>(f.size());
      bytes.append(reinterpret_cast<const char*>(&n), sizeof(n));
      bytes += f;
    }
  }
  BroadcastString(group, bytes);
}

std::optional<DirectRoute> ReceiveRoute(model::TensorParallelGroup* group) {
  const std::string bytes = BroadcastString(group, "");
  if (bytes.empty()) return std::nullopt;
  std::vector<std::string> fields;
  size_t at = 0;
  while (at < bytes.size()) {
    uint32_t n = 0;
    if (bytes.size() - at < sizeof(n)) throw std::runtime_error("rank 0 announced a bad route");
    std::memcpy(&n, bytes.data() + at, sizeof(n));
    at += sizeof(n);
    if (bytes.size() - at < n) throw std::runtime_error("rank 0 announced a bad route");
    fields.push_back(bytes.substr(at, n));
    at += n;
  }
  if (fields.size() != 4) throw std::runtime_error("rank 0 announced a bad route");
  DirectRoute r;
  r.store_address = fields[0];
  r.group = fields[1];
  r.bind_host = fields[2];
  r.timeout_s = std::atof(fields[3].c_str());
  return r;
}

StatusOr<comm::Receipt> ReceiveDirectSlices(const DirectRoute& route, DirectReceiver* receiver,
                                            const model::NamedTensors& slices,
                                            model::TensorParallelGroup* group) {
  const int rank = group->rank(), size = group->size();
  const std::string name = comm::TensorParallelWeightGroup(route.group, rank);
  const double timeout = route.timeout_s > 0 ? route.timeout_s : 60.0;
  // This rank's part: join (or keep) its group, receive, check. No collective of `group` here,
  // so that a rank's failure cannot put the ranks out of step.
  StatusOr<comm::Receipt> r = Unavailable("no transfer");
  Status local;
  if (!receiver->comm || receiver->comm->aborted() || receiver->group != name) {
    receiver->comm.reset();
    comm::GlooOptions o;
    o.store_address = route.store_address;
    o.group = name;
    o.rank = 1;
    o.size = 2;
    if (!route.bind_host.empty()) o.bind_host = route.bind_host;
    o.connect_timeout_s = timeout;
    auto c = comm::CreateGlooCommunicator(o);
    if (c.ok()) {
      receiver->comm = std::move(*c);
      receiver->group = name;
    } else {
      local = c.status().WithContext("join weight group " + name);
    }
  }
  if (local.ok()) {
    r = comm::ReceivePublishedWeights(receiver->comm.get(), 0, comm::DeadlineAfter(timeout),
                                      &receiver->payload);
    if (!r.ok()) {
      local = r.status();
      if (receiver->comm->aborted()) receiver->comm.reset();
    }
  }
  if (local.ok()) {
    local = model::CheckFlatManifest(receiver->payload.manifest, receiver->payload.bytes.size(),
                                     slices);
  }
  // Every rank has its slices, or no rank loads.
  const std::string missing = model::TensorParallelRanksNotOk(group, local.ok());
  if (!missing.empty()) {
    if (!local.ok()) return local.WithContext("tensor-parallel rank " + std::to_string(rank));
    return Unavailable("tensor-parallel rank(s) " + missing +
                       " did not receive their slices of the version; nothing loaded");
  }
  // Checked above, so it cannot fail part-way; the exchange below runs either way, in step.
  const Status loaded =
      model::LoadFlatParameters(receiver->payload.manifest, receiver->payload.bytes.data(),
                                receiver->payload.bytes.size(), slices);
  // Every rank's bytes and bucket checksums, in rank order (rank 0 reports them).
  comm::Receipt out = *r;
  out.bytes = 0;
  out.bucket_crc32.clear();
  for (int q = 0; q < size; ++q) {
    at::Tensor count = Count(q == rank ? static_cast<int64_t>(r->bucket_crc32.size()) : 0);
    group->Broadcast(count, q);
    const int64_t buckets = count.data_ptr<int64_t>()[0];
    if (buckets < 0 || buckets > (int64_t{1} << 32)) {
      throw std::runtime_error("a tensor-parallel rank announced a bad bucket count");
    }
    at::Tensor words = at::zeros({buckets + 1}, at::TensorOptions().dtype(at::kLong));
    if (q == rank) {
      int64_t* w = words.data_ptr<int64_t>();
      w[0] = static_cast<int64_t>(r->bytes);
      for (int64_t b = 0; b < buckets; ++b) w[b + 1] = r->bucket_crc32[static_cast<size_t>(b)];
    }
    group->Broadcast(words, q);
    const int64_t* w = words.data_ptr<int64_t>();
    out.bytes += static_cast<uint64_t>(w[0]);
    for (int64_t b = 0; b < buckets; ++b) {
      out.bucket_crc32.push_back(static_cast<uint32_t>(w[b + 1]));
    }
  }
  GYRE_RETURN_IF_ERROR(loaded);
  return out;
}

}  // namespace gyre::rollout
