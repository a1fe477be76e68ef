#include "model/weights.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/crc32.h"
#include "model/safetensors.h"

namespace gyre::model {

uint32_t Crc32(const uint8_t* data, uint64_t n) { return gyre::Crc32(data, n); }

StatusOr<at::ScalarType> ParseWeightDtype(const std::string& name) {
  if (name == "float32" || name == "F32") return at::kFloat;
  if (name == "bfloat16" || name == "BF16") return at::kBFloat16;
  if (name == "float16" || name == "F16") return at::kHalf;
  return InvalidArgument("unknown weight dtype '" + name + "' (float32, bfloat16 or float16)");
}

std::string WeightDtypeName(at::ScalarType type) {
  switch (type) {
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    default:
      return "float32";
  }
}

std::vector<TensorEntry> ParameterManifest(const NamedTensors& params, uint64_t* total_bytes,
                                           at::ScalarType dtype) {
  std::vector<TensorEntry> manifest;
  uint64_t total = 0;
  const uint64_t esize = dtype == at::kFloat ? 4 : 2;
  for (const auto& [name, t] : params) {
    TensorEntry e;
    e.name = name;
    e.shape = t.sizes().vec();
    e.dtype = WeightDtypeName(dtype);
    e.offset = total;
    e.nbytes = static_cast<uint64_t>(t.numel()) * esize;
    total += e.nbytes;
    manifest.push_back(std::move(e));
  }
  *total_bytes = total;
  return manifest;
}

std::vector<uint8_t> FlattenParameters(const NamedTensors& params,
                                       std::vector<TensorEntry>* manifest, at::ScalarType dtype) {
  uint64_t total = 0;
  *manifest = ParameterManifest(params, &total, dtype);
  std::vector<uint8_t> out(total);
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor c = params[i].second.detach().to(dtype).contiguous().cpu();
    std::memcpy(out.data() + (*manifest)[i].offset, c.data_ptr(), (*manifest)[i].nbytes);
  }
  return out;
}

namespace {

std::string ShapeString(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

struct Matched {
  const TensorEntry* entry;
  at::ScalarType dtype;
};

// Validates `manifest` against `params` and the payload size; returns each parameter's entry.
StatusOr<std::vector<Matched>> MatchManifest(const std::vector<TensorEntry>& manifest,
                                             uint64_t payload_bytes, const NamedTensors& params) {
  std::map<std::string, const TensorEntry*> by_name;
  for (const auto& e : manifest) {
    if (!by_name.emplace(e.name, &e).second) {
      return InvalidArgument("tensor '" + e.name + "' appears twice");
    }
  }
  std::vector<Matched> out;
  for (const auto& [name, t] : params) {
    auto it = by_name.find(name);
    if (it == by_name.end()) return InvalidArgument("missing tensor '" + name + "'");
    const TensorEntry& e = *it->second;
    if (e.shape != t.sizes().vec()) {
      return InvalidArgument("tensor '" + name + "' has shape " + ShapeString(e.shape) +
                             ", the model expects " + ShapeString(t.sizes().vec()));
    }
    const StatusOr<at::ScalarType> dtype = ParseWeightDtype(e.dtype);
    if (!dtype.ok()) {
      return InvalidArgument("tensor '" + name + "' has dtype '" + e.dtype +
                             "'; weights travel as float32, bfloat16 or float16");
    }
    const uint64_t esize = *dtype == at::kFloat ? 4 : 2;
    if (e.nbytes != static_cast<uint64_t>(t.numel()) * esize || e.offset > payload_bytes ||
        e.nbytes > payload_bytes - e.offset) {
      return InvalidArgument("tensor '" + name + "' has byte range [" + std::to_string(e.offset) +
                             ", +" + std::to_string(e.nbytes) + ") outside the payload of " +
                             std::to_string(payload_bytes) + " bytes or of the wrong size");
    }
    out.push_back({&e, *dtype});
  }
  if (by_name.size() != params.size()) {
    std::map<std::string, int> known;
    for (const auto& p : params) known[p.first] = 1;
    for (const auto& e : manifest) {
      if (!known.count(e.name)) return InvalidArgument("unexpected tensor '" + e.name + "'");
    }
  }
  return out;
}

}  // namespace

Status CheckFlatManifest(const std::vector<TensorEntry>& manifest, uint64_t payload_bytes,
                         const NamedTensors& params) {
  return MatchManifest(manifest, payload_bytes, params).status();
}

Status LoadFlatParameters(const std::vector<TensorEntry>& manifest, const uint8_t* payload,
                          uint64_t payload_bytes, const NamedTensors& params,
                          const at::Device& payload_device) {
  GYRE_ASSIGN_OR_RETURN(auto entries, MatchManifest(manifest, payload_bytes, params));
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& dst = params[i].second;
    const auto options = at::TensorOptions().dtype(entries[i].dtype).device(payload_device);
    at::Tensor src = at::from_blob(const_cast<uint8_t*>(payload + entries[i].entry->offset),
                                   dst.sizes(), options);
    dst.detach().copy_(src);  // converts to the parameter's dtype
  }
  return Status::Ok();
}

Status FlattenParametersInto(const NamedTensors& params, const std::vector<TensorEntry>& manifest,
                             void* dst, uint64_t dst_bytes, const at::Device& device) {
  GYRE_ASSIGN_OR_RETURN(auto entries, MatchManifest(manifest, dst_bytes, params));
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& src = params[i].second;
    const auto options = at::TensorOptions().dtype(entries[i].dtype).device(device);
    at::Tensor out =
        at::from_blob(static_cast<uint8_t*>(dst) + entries[i].entry->offset, src.sizes(), options);
    out.copy_(src.detach());  // converts to the manifest's dtype
  }
  return Status::Ok();
}

namespace {

StatusOr<at::ScalarType> WriterType(const std::string& dtype) {
  if (dtype == "F32") return at::kFloat;
  if (dtype == "F16") return at::kHalf;
  if (dtype == "BF16") return at::kBFloat16;
  return InvalidArgument("cannot write safetensors dtype '" + dtype + "' (F32, F16 or BF16)");
}

}  // namespace

Status SaveSafetensors(const std::string& path, const NamedTensors& params,
                       const std::string& dtype) {
  GYRE_ASSIGN_OR_RETURN(at::ScalarType type, WriterType(dtype));
  const int64_t esize = dtype == "F32" ? 4 : 2;
  std::vector<std::pair<std::string, at::Tensor>> sorted(params.begin(), params.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}, {"producer", "gyre"}};
  uint64_t offset = 0;
  for (const auto& [name, t] : sorted) {
    uint64_t n = static_cast<uint64_t>(t.numel() * esize);
    header[name] = {
        {"dtype", dtype}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Unavailable("cannot write " + tmp);
    uint64_t len = h.size();
    unsigned char le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>((len >> (8 * i)) & 0xff);
    out.write(reinterpret_cast<const char*>(le), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& [name, t] : sorted) {
      at::Tensor c = t.detach().to(type).contiguous().cpu();
      out.write(reinterpret_cast<const char*>(c.data_ptr()),
                static_cast<std::streamsize>(c.numel() * esize));
    }
    out.flush();
    if (!out) return Unavailable("short write to " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Unavailable("cannot rename " + tmp + " to " + path);
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(const std::string& path,
                                                                       std::vector<Entry> entries,
                                                                       const std::string& dtype) {
  GYRE_ASSIGN_OR_RETURN(at::ScalarType type, WriterType(dtype));
  const uint64_t esize = dtype == "F32" ? 4 : 2;
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}, {"producer", "gyre"}};
  uint64_t offset = 0;
  for (const Entry& e : entries) {
    if (header.contains(e.name)) return InvalidArgument(path + ": tensor '" + e.name + "' twice");
    uint64_t n = esize;
    for (int64_t d : e.shape) {
      if (d < 0) return InvalidArgument(path + ": tensor '" + e.name + "' has a negative size");
      n *= static_cast<uint64_t>(d);
    }
    header[e.name] = {{"dtype", dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  w->path_ = path;
  w->tmp_ = path + ".tmp";
  w->entries_ = std::move(entries);
  w->type_ = type;
  w->file_ = std::fopen(w->tmp_.c_str(), "wb");
  if (w->file_ == nullptr) return Unavailable("cannot write " + w->tmp_);
  unsigned char le[8];
  const uint64_t len = h.size();
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>((len >> (8 * i)) & 0xff);
  if (std::fwrite(le, 1, 8, w->file_) != 8 ||
      std::fwrite(h.data(), 1, h.size(), w->file_) != h.size()) {
    return Unavailable("short write to " + w->tmp_);
  }
  return w;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(tmp_.c_str());
  }
}

Status SafetensorsWriter::Append(const std::string& name, const at::Tensor& tensor) {
  if (file_ == nullptr) return FailedPrecondition(path_ + ": the writer has finished");
  if (next_ >= entries_.size()) {
    return InvalidArgument(path_ + ": tensor '" + name + "' is one more than the header lists");
  }
  const Entry& e = entries_[next_];
  if (name != e.name || tensor.sizes().vec() != e.shape) {
    return InvalidArgument(path_ + ": tensor '" + name + "' appended where the header has '" +
                           e.name + "' of its shape");
  }
  const at::Tensor c = tensor.detach().to(at::kCPU, type_).contiguous();
  const size_t n = static_cast<size_t>(c.nbytes());
  if (std::fwrite(c.data_ptr(), 1, n, file_) != n) return Unavailable("short write to " + tmp_);
  ++next_;
  return Status::Ok();
}

Status SafetensorsWriter::Finish() {
  if (file_ == nullptr) return FailedPrecondition(path_ + ": the writer has finished");
  if (next_ != entries_.size()) {
    return FailedPrecondition(path_ + ": " + std::to_string(next_) + " of " +
                              std::to_string(entries_.size()) + " tensors written");
  }
  const bool flushed = std::fflush(file_) == 0 && ::fsync(fileno(file_)) == 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!flushed || !closed) {
    std::remove(tmp_.c_str());
    return Unavailable("cannot write " + tmp_);
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    std::remove(tmp_.c_str());
    return Unavailable("cannot rename " + tmp_ + " to " + path_);
  }
  return Status::Ok();
}

Status SaveCheckpointWeights(const std::string& dir, const NamedTensors& params,
                             const std::string& dtype, uint64_t max_shard_bytes) {
  GYRE_RETURN_IF_ERROR(WriterType(dtype).status());
  const uint64_t esize = dtype == "F32" ? 4 : 2;
  // Greedy packing in name order, as transformers does: a new shard starts when the next tensor
  // would push the current one past the limit (a single larger tensor gets a shard of its own).
  std::vector<std::pair<std::string, at::Tensor>> sorted(params.begin(), params.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<NamedTensors> shards(1);
  uint64_t current = 0, total = 0;
  for (const auto& p : sorted) {
    const uint64_t n = static_cast<uint64_t>(p.second.numel()) * esize;
    if (current > 0 && current + n > max_shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(p);
    current += n;
    total += n;
  }
  if (shards.size() == 1) return SaveSafetensors(dir + "/model.safetensors", params, dtype);
  nlohmann::json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = nlohmann::json::object();
  char name[64];
  for (size_t i = 0; i < shards.size(); ++i) {
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    GYRE_RETURN_IF_ERROR(SaveSafetensors(dir + "/" + name, shards[i], dtype));
    for (const auto& [tensor, t] : shards[i]) index["weight_map"][tensor] = name;
  }
  std::ofstream out(dir + "/model.safetensors.index.json");
  out << index.dump(2) << "\n";
  if (!out) return Unavailable("cannot write " + dir + "/model.safetensors.index.json");
  return Status::Ok();
}

Status LoadSafetensors(const std::string& path, const NamedTensors& params) {
  GYRE_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::OpenFile(path));
  return LoadParameters(*ckpt, params, {}).WithContext(path);
}

}  // namespace gyre::model
