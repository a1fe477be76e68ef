#pragma once
// Reading safetensors checkpoints: one file or a sharded set (model.safetensors.index.json).
//
// Format: an 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the
// tensor bytes; offsets are relative to the end of the header. Files are memory-mapped and
// tensors are read in place (no copy until they are converted into a model's parameters).
// Every structural problem is a DATA_LOSS / INVALID_ARGUMENT error naming the file and the
// tensor: truncated file, bad JSON, unknown dtype, shape/size mismatch, out-of-range or
// overlapping offsets.
//
// A SafetensorsFile is immutable after Open and may be read from several threads.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gyre/status.h"
#include "model/transformer.h"

namespace gyre::model {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL"
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets in the data section
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // A tensor that aliases the mapped bytes (valid while this object lives). Fails for unknown
  // names.
  StatusOr<at::Tensor> View(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  uint64_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint directory: model.safetensors, or model.safetensors.index.json with its shards.
class Checkpoint {
 public:
  static StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);
  // A checkpoint made of one safetensors file.
  static StatusOr<std::unique_ptr<Checkpoint>> OpenFile(const std::string& path);
  // Tensor names across all shards.
  std::vector<std::string> Names() const;
  bool Has(const std::string& name) const { return where_.count(name) > 0; }
  StatusOr<at::Tensor> View(const std::string& name) const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

// Copies the checkpoint's tensors into `params` (converting to each parameter's dtype). Every
// parameter must be present with the same shape; extra tensors are an error except those listed
// in `ignorable` (exact names) — e.g. lm_head.weight of a tied model, rotary inv_freq buffers.
// Nothing is written unless everything checks out.
Status LoadParameters(const Checkpoint& ckpt, const NamedTensors& params,
                      const std::vector<std::string>& ignorable);

// Bytes per element of a safetensors dtype, or 0 if unknown.
int DtypeSize(const std::string& dtype);

}  // namespace gyre::model
