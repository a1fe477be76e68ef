#pragma once
// A small GGUF writer for tests and fuzz seeds (model/gguf.h reads the format): metadata of any
// value type and tensors whose bytes the caller gives, laid out as llama.cpp writes them
// (version 3, 32-byte alignment unless `alignment` says otherwise).

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace gyre::testing {

class GgufWriter {
 public:
  explicit GgufWriter(uint64_t alignment = 32) : alignment_(alignment) {}

  // Raw metadata: `type` and the value's encoded bytes (see the Encode helpers).
  void Meta(const std::string& key, uint32_t type, const std::string& value) {
    kv_ += Str(key) + U32(type) + value;
    ++kv_count_;
  }
  void MetaU32(const std::string& key, uint32_t v) { Meta(key, 4, U32(v)); }
  void MetaF32(const std::string& key, float v) { Meta(key, 6, F32(v)); }
  void MetaStr(const std::string& key, const std::string& v) { Meta(key, 8, Str(v)); }
  void MetaStrings(const std::string& key, const std::vector<std::string>& v) {
    std::string body = U32(8) + U64(v.size());
    for (const auto& s : v) body += Str(s);
    Meta(key, 9, body);
  }
  void MetaI32s(const std::string& key, const std::vector<int32_t>& v) {
    std::string body = U32(5) + U64(v.size());
    for (int32_t x : v) body += U32(static_cast<uint32_t>(x));
    Meta(key, 9, body);
  }

  // A tensor of ggml `type` with `dims` (fastest first) and its encoded `bytes`.
  void Tensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type,
              const std::string& bytes) {
    while (data_.size() % alignment_ != 0) data_.push_back('\0');
    infos_ += Str(name) + U32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) infos_ += U64(d);
    infos_ += U32(type) + U64(data_.size());
    data_ += bytes;
    ++tensor_count_;
  }

  std::string Bytes() const {
    std::string out = "GGUF" + U32(3) + U64(tensor_count_) + U64(kv_count_) + kv_ + infos_;
    while (out.size() % alignment_ != 0) out.push_back('\0');
    return out + data_;
  }

  static std::string U32(uint32_t v) { return Raw(&v, 4); }
  static std::string U64(uint64_t v) { return Raw(&v, 8); }
  static std::string F32(float v) { return Raw(&v, 4); }
  static std::string U16(uint16_t v) { return Raw(&v, 2); }
  static std::string Str(const std::string& s) { return U64(s.size()) + s; }

 private:
  static std::string Raw(const void* p, size_t n) {
    return std::string(static_cast<const char*>(p), n);
  }
  uint64_t alignment_;
  uint64_t kv_count_ = 0, tensor_count_ = 0;
  std::string kv_, infos_, data_;
};

}  // namespace gyre::testing
