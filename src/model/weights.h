#pragma once
// Moving parameters in and out of a model: a flat byte payload with a manifest (for weight
// transfer in buckets) and safetensors files (for checkpoints other tools can read).
// Functions that write into a model's tensors must not race with a forward pass.

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gyre/status.h"
#include "model/transformer.h"

namespace gyre::model {

struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;  // "float32", "bfloat16" or "float16": how the bytes are laid out
  uint64_t offset = 0;
  uint64_t nbytes = 0;
};

// The payload dtypes: "float32", "bfloat16", "float16" (also safetensors' F32, BF16, F16).
StatusOr<at::ScalarType> ParseWeightDtype(const std::string& name);
std::string WeightDtypeName(at::ScalarType type);  // float32, bfloat16 or float16

// Copies every parameter, in NamedParameters() order, into one contiguous payload in `dtype`
// (converting: a float32 master model publishes bfloat16 weights for a bfloat16 rollout).
std::vector<uint8_t> FlattenParameters(const NamedTensors& params,
                                       std::vector<TensorEntry>* manifest,
                                       at::ScalarType dtype = at::kFloat);

// The manifest FlattenParameters writes (same order and offsets), without copying; the payload
// size goes to *total_bytes.
std::vector<TensorEntry> ParameterManifest(const NamedTensors& params, uint64_t* total_bytes,
                                           at::ScalarType dtype = at::kFloat);

// Copies every parameter, converted to the manifest's dtype, into the `dst_bytes` bytes at `dst`,
// which live on `device` (a CUDA device's memory for the GPU weight transports), laid out as
// `manifest` (ParameterManifest of the same parameters). The copies are enqueued on the device's
// current stream; the caller synchronises before other streams or processes read `dst`.
Status FlattenParametersInto(const NamedTensors& params, const std::vector<TensorEntry>& manifest,
                             void* dst, uint64_t dst_bytes, const at::Device& device);

// Whether LoadFlatParameters(manifest, ..., payload_bytes, params) would load: the manifest names
// exactly `params` with their shapes, in a payload dtype, inside `payload_bytes`. Nothing is read.
Status CheckFlatManifest(const std::vector<TensorEntry>& manifest, uint64_t payload_bytes,
                         const NamedTensors& params);

// Copies `payload` into `params`, converting from the manifest's dtype to theirs. The manifest
// must name exactly the model's parameters with the same shapes; on any mismatch nothing is
// written and the error names the tensor. The payload lives in host memory, or on
// `payload_device` (e.g. a CUDA device) when given.
Status LoadFlatParameters(const std::vector<TensorEntry>& manifest, const uint8_t* payload,
                          uint64_t payload_bytes, const NamedTensors& params,
                          const at::Device& payload_device = at::Device(at::kCPU));

// Writes `params` as a safetensors file (8-byte little-endian header length, JSON header padded
// with spaces to a multiple of 8, tensors contiguous in sorted-name order) in `dtype` (F32, F16
// or BF16), atomically: the file is written next to `path` and renamed into place.
Status SaveSafetensors(const std::string& path, const NamedTensors& params,
                       const std::string& dtype = "F32");

// The weights of a Hugging Face directory: `dir`/model.safetensors when they fit in
// `max_shard_bytes`, otherwise model-0000i-of-0000N.safetensors shards plus
// model.safetensors.index.json (weight_map and metadata.total_size).
Status SaveCheckpointWeights(const std::string& dir, const NamedTensors& params,
                             const std::string& dtype = "F32",
                             uint64_t max_shard_bytes = 5ull << 30);

// Writes a safetensors file one tensor at a time, for a caller that never holds all of them at
// once (a sharded trainer gathers its model unit by unit, model::ParameterUnits). The names and
// shapes are fixed up front (the header comes first); the data follow in the order given, which
// need not be name order (safetensors only asks that the byte ranges tile the data section).
// Atomic like SaveSafetensors: Finish() renames the written file into place; a writer destroyed
// before Finish() removes it.
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
  };
  // `dtype`: F32, F16 or BF16. Writes the header.
  static StatusOr<std::unique_ptr<SafetensorsWriter>> Create(const std::string& path,
                                                             std::vector<Entry> entries,
                                                             const std::string& dtype = "F32");
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next entry's data (converted to the file's dtype); its name and shape must be that
  // entry's.
  Status Append(const std::string& name, const at::Tensor& tensor);
  // After every entry was appended: flushes, syncs and renames the file into place.
  Status Finish();

 private:
  SafetensorsWriter() = default;
  std::string path_, tmp_;
  std::vector<Entry> entries_;
  at::ScalarType type_ = at::kFloat;
  size_t next_ = 0;
  std::FILE* file_ = nullptr;
};

// Reads a safetensors file into `params` (see model/safetensors.h for the checks), converting
// dtypes. Nothing is written on error.
Status LoadSafetensors(const std::string& path, const NamedTensors& params);

// CRC-32 (zlib polynomial) of a byte range.
uint32_t Crc32(const uint8_t* data, uint64_t n);

}  // namespace gyre::model
