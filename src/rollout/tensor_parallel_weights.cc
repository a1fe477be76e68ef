#include "rollout/tensor_parallel_weights.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <map>
#include <string>

namespace gyre::rollout {
namespace {

// Per tensor, what the other ranks need to receive it: dtype code, rank, the two extents (1 for
// a vector's second), bytes.
constexpr int64_t kDescriptor = 5;

int64_t DtypeCode(at::ScalarType t) { return t == at::kFloat ? 0 : t == at::kBFloat16 ? 1 : 2; }
at::ScalarType CodeDtype(int64_t c) {
  return c == 0 ? at::kFloat : c == 1 ? at::kBFloat16 : at::kHalf;
}

std::vector<int64_t> SliceShape(const std::string& name, std::vector<int64_t> whole, int rank,
                                int size) {
  const int d = model::TensorParallelDim(name);
  if (d >= 0 && d < static_cast<int>(whole.size())) {
    const auto [begin, end] = model::TensorParallelRange(name, whole[d], rank, size);
    whole[d] = end - begin;
  }
  return whole;
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

}  // namespace

Status SendSlices(const Status& have, const std::vector<model::TensorEntry>& manifest,
                  const uint8_t* payload, uint64_t payload_bytes, const model::NamedTensors& slices,
                  model::TensorParallelGroup* group) {
  const int rank = group->rank(), size = group->size();
  const int64_t n = static_cast<int64_t>(slices.size());
  std::vector<const model::TensorEntry*> entries;
  std::vector<at::ScalarType> dtypes;
  Status valid = have;
  if (valid.ok() && manifest.size() != slices.size()) {
    valid = InvalidArgument("the version has " + std::to_string(manifest.size()) +
                            " tensors, the model " + std::to_string(slices.size()));
  }
  if (valid.ok()) {
    std::map<std::string, const model::TensorEntry*> by_name;
    for (const auto& e : manifest) by_name[e.name] = &e;
    for (const auto& [name, param] : slices) {
      auto it = by_name.find(name);
      if (it == by_name.end()) {
        valid = InvalidArgument("the version has no tensor " + name);
        break;
      }
      const model::TensorEntry& e = *it->second;
      auto dtype = model::ParseWeightDtype(e.dtype);
      if (!dtype.ok()) {
        valid = dtype.status().WithContext(name);
        break;
      }
      int64_t numel = 1;
      for (int64_t d : e.shape) numel *= d;
      const uint64_t want = static_cast<uint64_t>(numel) * at::elementSize(*dtype);
      if (e.shape.empty() || e.shape.size() > 2 || e.nbytes != want || e.offset > payload_bytes ||
          e.nbytes > payload_bytes - e.offset) {
        valid = InvalidArgument(name + ": shape " + ShapeText(e.shape) + " with " +
                                std::to_string(e.nbytes) + " bytes at offset " +
                                std::to_string(e.offset) + " does not fit a payload of " +
                                std::to_string(payload_bytes) + " bytes");
        break;
      }
      const std::vector<int64_t> mine = SliceShape(name, e.shape, rank, size);
      if (mine != param.sizes().vec()) {
        valid = InvalidArgument(name + ": the version's " + ShapeText(e.shape) + " slices to " +
                                ShapeText(mine) + " on rank 0, which holds " +
                                ShapeText(param.sizes().vec()));
        break;
      }
      entries.push_back(&e);
      dtypes.push_back(*dtype);
    }
  }
  if (!valid.ok()) {
    at::Tensor refuse = Count(-1);
    group->Broadcast(refuse, 0);
    return valid;
  }
  at::Tensor count = Count(n);
  group->Broadcast(count, 0);
  at::Tensor descriptors = at::zeros({n, kDescriptor}, at::TensorOptions().dtype(at::kLong));
  int64_t* d = descriptors.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i, d += kDescriptor) {
    const model::TensorEntry& e = *entries[i];
    d[0] = DtypeCode(dtypes[i]);
    d[1] = static_cast<int64_t>(e.shape.size());
    d[2] = e.shape[0];
    d[3] = e.shape.size() > 1 ? e.shape[1] : 1;
    d[4] = static_cast<int64_t>(e.nbytes);
  }
  group->Broadcast(descriptors, 0);
  for (int64_t i = 0; i < n; ++i) {
    const model::TensorEntry& e = *entries[i];
    // The root only reads its buffer.
    at::Tensor whole = at::from_blob(const_cast<uint8_t*>(payload + e.offset), e.shape,
                                     at::TensorOptions().dtype(dtypes[i]));
    group->Broadcast(whole, 0);
    CopySlice(slices[i].first, whole, rank, size, slices[i].second);
  }
  return Status::Ok();
}

Status ReceiveSlices(const model::NamedTensors& slices, model::TensorParallelGroup* group) {
  const int rank = group->rank(), size = group->size();
  at::Tensor count = Count(0);
  group->Broadcast(count, 0);
  const int64_t n = count.data_ptr<int64_t>()[0];
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
  // Every tensor is received, so that the ranks stay in step, even after a mismatch.
  const int64_t* d = descriptors.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i, d += kDescriptor) {
    std::vector<int64_t> shape = {d[2]};
    if (d[1] > 1) shape.push_back(d[3]);
    at::Tensor whole = at::empty(shape, at::TensorOptions().dtype(CodeDtype(d[0])));
    group->Broadcast(whole, 0);
    if (!result.ok()) continue;
    const auto& [name, param] = slices[static_cast<size_t>(i)];
    const std::vector<int64_t> mine = SliceShape(name, shape, rank, size);
    if (mine != param.sizes().vec()) {
      result = Internal(name + ": rank 0's " + ShapeText(shape) + " slices to " + ShapeText(mine) +
                        " on rank " + std::to_string(rank) + ", which holds " +
                        ShapeText(param.sizes().vec()));
      continue;
    }
    CopySlice(name, whole, rank, size, param);
  }
  return result;
}

}  // namespace gyre::rollout
