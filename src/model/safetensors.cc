#include "model/safetensors.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/file_util.h"

namespace gyre::model {

int DtypeSize(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL") return 1;
  return 0;
}

namespace {

at::ScalarType ToScalarType(const std::string& d) {
  if (d == "F64") return at::kDouble;
  if (d == "F32") return at::kFloat;
  if (d == "F16") return at::kHalf;
  if (d == "BF16") return at::kBFloat16;
  if (d == "I64") return at::kLong;
  if (d == "I32") return at::kInt;
  if (d == "I16") return at::kShort;
  if (d == "I8") return at::kChar;
  if (d == "U8") return at::kByte;
  return at::kBool;
}

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound("cannot open " + path + ": " + std::strerror(errno));
  struct stat st;
  ::fstat(fd, &st);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return DataLoss(path + ": truncated (" + std::to_string(size) + " bytes, no header length)");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return Unavailable("cannot mmap " + path + ": " + std::strerror(errno));
  f->map_ = map;
  f->map_size_ = size;
  // Checkpoints are read front to back, once: ask for aggressive read-ahead.
  ::madvise(map, size, MADV_SEQUENTIAL);
  ::madvise(map, size, MADV_WILLNEED);
  const uint8_t* bytes = static_cast<const uint8_t*>(map);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  if (hlen > size - 8) {
    return DataLoss(path + ": header length " + std::to_string(hlen) + " exceeds the file size " +
                    std::to_string(size));
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + hlen);
  } catch (const std::exception& e) {
    return DataLoss(path + ": bad JSON header: " + e.what());
  }
  if (!header.is_object()) return DataLoss(path + ": the JSON header is not an object");
  f->data_ = bytes + 8 + hlen;
  const uint64_t data_size = size - 8 - hlen;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it.value().is_object()) {
        for (auto m = it.value().begin(); m != it.value().end(); ++m) {
          if (m.value().is_string()) f->metadata_[m.key()] = m.value().get<std::string>();
        }
      }
      continue;
    }
    const std::string where = path + ": tensor '" + it.key() + "'";
    SafetensorsEntry e;
    e.name = it.key();
    try {
      e.dtype = it.value().at("dtype").get<std::string>();
      // Integers only: get<> would convert a float such as 1e40 (undefined behaviour).
      for (const char* key : {"shape", "data_offsets"}) {
        const auto& list = it.value().at(key);
        if (!list.is_array()) return DataLoss(where + ": " + key + " must be a list of integers");
        for (const auto& v : list) {
          if (!v.is_number_integer()) {
            return DataLoss(where + ": " + key + " must be a list of integers, got " + v.dump());
          }
        }
      }
      e.shape = it.value().at("shape").get<std::vector<int64_t>>();
      auto offs = it.value().at("data_offsets").get<std::vector<uint64_t>>();
      if (offs.size() != 2) return DataLoss(where + ": data_offsets must have two entries");
      e.begin = offs[0];
      e.end = offs[1];
    } catch (const std::exception& ex) {
      return DataLoss(where + ": malformed entry: " + ex.what());
    }
    const int esize = DtypeSize(e.dtype);
    if (esize == 0) return InvalidArgument(where + ": unknown dtype '" + e.dtype + "'");
    uint64_t numel = 1;
    for (int64_t d : e.shape) {
      if (d < 0) return DataLoss(where + ": negative dimension in shape " + ShapeStr(e.shape));
      // A product past 2^63 elements would wrap and could match a small byte range.
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) ||
          numel > static_cast<uint64_t>(INT64_MAX) / 8) {
        return DataLoss(where + ": shape " + ShapeStr(e.shape) + " has too many elements");
      }
    }
    if (e.end < e.begin || e.end > data_size) {
      return DataLoss(where + ": byte range [" + std::to_string(e.begin) + ", " +
                      std::to_string(e.end) + ") lies outside the data section of " +
                      std::to_string(data_size) + " bytes (truncated file?)");
    }
    if (e.end - e.begin != numel * static_cast<uint64_t>(esize)) {
      return DataLoss(where + ": shape " + ShapeStr(e.shape) + " of " + e.dtype + " needs " +
                      std::to_string(numel * esize) + " bytes, the entry has " +
                      std::to_string(e.end - e.begin));
    }
    ranges.emplace_back(e.begin, e.end);
    f->entries_[e.name] = std::move(e);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      for (const auto& [name, e] : f->entries_) {
        if (e.begin == ranges[i].first) {
          return DataLoss(path + ": tensor '" + name + "' overlaps another tensor's bytes");
        }
      }
    }
  }
  return f;
}

StatusOr<at::Tensor> SafetensorsFile::View(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return NotFound(path_ + ": no tensor '" + name + "'");
  const SafetensorsEntry& e = it->second;
  // Known to DtypeSize (so Open accepts a file holding them) but without an ATen type here.
  if (e.dtype == "U16" || e.dtype == "U32" || e.dtype == "U64") {
    return InvalidArgument(path_ + ": tensor '" + name + "' has dtype " + e.dtype +
                           ", which Gyre cannot load");
  }
  return at::from_blob(const_cast<uint8_t*>(data_ + e.begin), e.shape,
                       at::TensorOptions().dtype(ToScalarType(e.dtype)));
}

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  auto ckpt = std::make_unique<Checkpoint>();
  const std::string index = dir + "/model.safetensors.index.json";
  std::vector<std::string> shards;
  if (PathExists(index)) {
    std::ifstream in(index);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      return DataLoss(index + ": bad JSON: " + e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
      return DataLoss(index + ": missing object \"weight_map\"");
    }
    std::set<std::string> files;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) return DataLoss(index + ": weight_map values must be strings");
      const std::string file = it.value().get<std::string>();
      if (file.find('/') != std::string::npos) {
        return InvalidArgument(index + ": shard name '" + file + "' must be a plain file name");
      }
      files.insert(file);
    }
    shards.assign(files.begin(), files.end());
    for (const auto& s : shards) {
      GYRE_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(dir + "/" + s));
      ckpt->files_.push_back(std::move(f));
    }
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      for (const auto& f : ckpt->files_) {
        if (f->path() == dir + "/" + it.value().get<std::string>()) {
          if (!f->entries().count(it.key())) {
            return DataLoss(index + ": tensor '" + it.key() + "' is not in " + f->path());
          }
          ckpt->where_[it.key()] = f.get();
        }
      }
    }
  } else {
    const std::string single = dir + "/model.safetensors";
    if (!PathExists(single)) {
      return NotFound(dir + " has neither model.safetensors nor model.safetensors.index.json");
    }
    return OpenFile(single);
  }
  return ckpt;
}

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::OpenFile(const std::string& path) {
  auto ckpt = std::make_unique<Checkpoint>();
  GYRE_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(path));
  for (const auto& [name, e] : f->entries()) ckpt->where_[name] = f.get();
  ckpt->files_.push_back(std::move(f));
  return ckpt;
}

std::vector<std::string> Checkpoint::Names() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : where_) out.push_back(name);
  return out;
}

StatusOr<at::Tensor> Checkpoint::View(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return NotFound("checkpoint has no tensor '" + name + "'");
  return it->second->View(name);
}

Status LoadParameters(const Checkpoint& ckpt, const NamedTensors& params,
                      const std::vector<std::string>& ignorable) {
  std::set<std::string> wanted;
  std::vector<at::Tensor> sources;
  for (const auto& [name, p] : params) {
    wanted.insert(name);
    auto view = ckpt.View(name);
    if (!view.ok()) return NotFound("checkpoint is missing tensor '" + name + "'");
    if (view->sizes() != p.sizes()) {
      return InvalidArgument("tensor '" + name + "' has shape " + ShapeStr(view->sizes().vec()) +
                             ", the model expects " + ShapeStr(p.sizes().vec()));
    }
    if (!at::isFloatingType(view->scalar_type())) {
      return InvalidArgument("tensor '" + name + "' is not a floating-point tensor");
    }
    sources.push_back(*view);
  }
  for (const auto& name : ckpt.Names()) {
    if (!wanted.count(name) &&
        std::find(ignorable.begin(), ignorable.end(), name) == ignorable.end()) {
      return InvalidArgument("checkpoint has unexpected tensor '" + name +
                             "' (does config.json match the weights?)");
    }
  }
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) params[i].second.detach().copy_(sources[i]);
  return Status::Ok();
}

}  // namespace gyre::model
