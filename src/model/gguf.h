#pragma once
// Reading GGUF files (llama.cpp's single-file model format, versions 2 and 3): the header, the
// metadata key/value pairs, the tensor table, and each tensor's data dequantised to float32.
//
// Layout (little-endian): magic "GGUF", version u32, tensor count u64, metadata count u64; the
// metadata (key string, value type u32, value; strings are u64 length + bytes, arrays are element
// type u32 + count u64 + elements); the tensor infos (name, n_dims u32, dims u64[n_dims] with the
// fastest-varying first, ggml type u32, offset u64 relative to the data section); then, aligned to
// general.alignment (default 32), the data section.
//
// Tensor types read: F32, F16, BF16, and the block quantisations Q8_0 (32 int8 and an f16 scale),
// Q4_0 (32 4-bit values, x = (q - 8) d) and Q4_1 (32 4-bit values, x = q d + m). Others are an
// error naming the tensor and its type.
//
// Every structural problem is an error naming the file (and the tensor or key): bad magic or
// version, counts, lengths or offsets beyond the file, a dimension product that overflows, data
// ranges that overlap or leave the file. The file is memory-mapped; a GgufFile is immutable after
// Open and may be read from several threads.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gyre/status.h"

namespace gyre::model {

// A metadata value. Arrays hold their elements (of one type) in `items`.
struct GgufValue {
  enum class Kind { kUint, kInt, kFloat, kBool, kString, kArray };
  Kind kind = Kind::kUint;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
  std::vector<GgufValue> items;
};

// ggml tensor types Gyre reads (their ids in the file).
enum class GgmlType : uint32_t { kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kBF16 = 30 };

struct GgufTensor {
  std::string name;
  std::vector<int64_t> dims;  // as stored: dims[0] varies fastest (the reverse of a torch shape)
  uint32_t type = 0;          // ggml type id
  uint64_t offset = 0;        // in the data section
  uint64_t bytes = 0;         // of its data
  int64_t elements = 0;
};

// The name of a ggml type id ("Q4_1"; "type 12" for ones Gyre does not know).
std::string GgmlTypeName(uint32_t type);

class GgufFile {
 public:
  static StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* Find(const std::string& name) const;

  // Typed metadata lookups: NotFound when absent, InvalidArgument when of another kind.
  StatusOr<std::string> String(const std::string& key) const;
  StatusOr<uint64_t> Uint(const std::string& key) const;  // any non-negative integer
  StatusOr<double> Float(const std::string& key) const;   // a float or an integer
  StatusOr<std::vector<std::string>> Strings(const std::string& key) const;

  // The tensor's values as float32, in stored order (dims[0] fastest).
  Status Dequantize(const GgufTensor& tensor, std::vector<float>* out) const;

 private:
  GgufFile() = default;
  std::string path_;
  void* map_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  const uint8_t* data_ = nullptr;  // the data section
  uint64_t data_size_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> by_name_;
};

// Dequantises `count` values of ggml type `type` from `src` (the bytes GgufTensor::bytes gives
// for them) into `dst`. InvalidArgument for a type Gyre does not read or a count that is not a
// whole number of blocks.
Status DequantizeGgml(uint32_t type, const uint8_t* src, int64_t count, float* dst);

}  // namespace gyre::model
