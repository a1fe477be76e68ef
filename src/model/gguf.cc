#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

namespace gyre::model {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
// Limits far above any real file, so that a hostile header cannot make Open allocate or loop
// without bound before the sizes are checked against the file.
constexpr uint64_t kMaxStringBytes = 1ull << 24;
constexpr uint64_t kMaxDims = 8;
constexpr int kMaxArrayDepth = 2;

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3FF) << 13;
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t Load16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }

// Bytes per block and values per block of a type; false for a type Gyre does not read.
bool BlockLayout(uint32_t type, uint64_t* block_bytes, int64_t* block_values) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      *block_bytes = 4, *block_values = 1;
      return true;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      *block_bytes = 2, *block_values = 1;
      return true;
    case GgmlType::kQ8_0:
      *block_bytes = 2 + 32, *block_values = 32;
      return true;
    case GgmlType::kQ4_0:
      *block_bytes = 2 + 16, *block_values = 32;
      return true;
    case GgmlType::kQ4_1:
      *block_bytes = 2 + 2 + 16, *block_values = 32;
      return true;
  }
  return false;
}

// A bounds-checked little-endian cursor over the mapped header.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size, std::string path)
      : data_(data), size_(size), path_(std::move(path)) {}
  uint64_t pos() const { return pos_; }

  Status Need(uint64_t n, const std::string& what) {
    if (n > size_ - pos_) {
      return Status(StatusCode::kDataLoss, path_ + ": truncated GGUF file (reading " + what +
                                               " at byte " + std::to_string(pos_) + ")");
    }
    return Status::Ok();
  }
  template <typename T>
  Status Read(T* out, const std::string& what) {
    GYRE_RETURN_IF_ERROR(Need(sizeof(T), what));
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }
  Status ReadString(std::string* out, const std::string& what) {
    uint64_t n = 0;
    GYRE_RETURN_IF_ERROR(Read(&n, what + " length"));
    if (n > kMaxStringBytes) {
      return InvalidArgument(path_ + ": " + what + " is " + std::to_string(n) +
                             " bytes long (more than a GGUF file holds)");
    }
    GYRE_RETURN_IF_ERROR(Need(n, what));
    out->assign(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return Status::Ok();
  }
  Status ReadValue(uint32_t type, GgufValue* v, const std::string& key, int depth) {
    switch (type) {
      case 0: {
        uint8_t x;
        GYRE_RETURN_IF_ERROR(Read(&x, key));
        v->kind = GgufValue::Kind::kUint, v->u = x;
        return Status::Ok();
      }
      case 1: {
        int8_t x;
        GYRE_RETURN_IF_ERROR(Read(&x, key));
        v->kind = GgufValue::Kind::kInt, v->i = x;
        return Status::Ok();
      }
      case 2: {
        uint16_t x;
        GYRE_RETURN_IF_ERROR(Read(&x, key));
        v->kind = GgufValue::Kind::kUint, v->u = x;
        return Status::Ok();
      }
      case 3: {
        int16_t x;
        GYRE_RETURN_IF_ERROR(Read(&x, key));
        v->kind = GgufValue::Kind::kInt, v->i = x;
        return Status::Ok();
      }
      case 4: {
        uint32_t x;
        GYRE_RETURN_IF_ERROR(Read(&x, key));
        v->kind = GgufValue::Kind::kUint, v->u = x;
        return Status::Ok();
      }
      case 5: {
        int32_t x;
        GYRE_RETURN_IF_ERROR(Read(&x, key));
        v->kind = GgufValue::Kind::kInt, v->i = x;
        return Status::Ok();
      }
      case 6: {
        float x;
        GYRE_RETURN_IF_ERROR(Read(&x, key));
        v->kind = GgufValue::Kind::kFloat, v->f = x;
        return Status::Ok();
      }
      case 7: {
        uint8_t x;
        GYRE_RETURN_IF_ERROR(Read(&x, key));
        if (x > 1)
          return InvalidArgument(path_ + ": metadata " + key + ": bool value " + std::to_string(x));
        v->kind = GgufValue::Kind::kBool, v->b = x != 0;
        return Status::Ok();
      }
      case 8:
        v->kind = GgufValue::Kind::kString;
        return ReadString(&v->s, "metadata " + key);
      case 9: {
        if (depth >= kMaxArrayDepth) {
          return InvalidArgument(path_ + ": metadata " + key + ": arrays nested too deeply");
        }
        uint32_t item_type = 0;
        uint64_t count = 0;
        GYRE_RETURN_IF_ERROR(Read(&item_type, key));
        GYRE_RETURN_IF_ERROR(Read(&count, key));
        // Every element takes at least one byte: a count beyond the file is a lie.
        GYRE_RETURN_IF_ERROR(
            Need(count, "metadata " + key + " (" + std::to_string(count) + " elements)"));
        v->kind = GgufValue::Kind::kArray;
        v->items.resize(count);
        for (uint64_t k = 0; k < count; ++k) {
          GYRE_RETURN_IF_ERROR(ReadValue(item_type, &v->items[k], key, depth + 1));
        }
        return Status::Ok();
      }
      case 10: {
        uint64_t x;
        GYRE_RETURN_IF_ERROR(Read(&x, key));
        v->kind = GgufValue::Kind::kUint, v->u = x;
        return Status::Ok();
      }
      case 11: {
        int64_t x;
        GYRE_RETURN_IF_ERROR(Read(&x, key));
        v->kind = GgufValue::Kind::kInt, v->i = x;
        return Status::Ok();
      }
      case 12: {
        double x;
        GYRE_RETURN_IF_ERROR(Read(&x, key));
        v->kind = GgufValue::Kind::kFloat, v->f = x;
        return Status::Ok();
      }
    }
    return InvalidArgument(path_ + ": metadata " + key + ": unknown value type " +
                           std::to_string(type));
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::string path_;
};

}  // namespace

std::string GgmlTypeName(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      return "F32";
    case GgmlType::kF16:
      return "F16";
    case GgmlType::kBF16:
      return "BF16";
    case GgmlType::kQ8_0:
      return "Q8_0";
    case GgmlType::kQ4_0:
      return "Q4_0";
    case GgmlType::kQ4_1:
      return "Q4_1";
  }
  return "type " + std::to_string(type);
}

Status DequantizeGgml(uint32_t type, const uint8_t* src, int64_t count, float* dst) {
  uint64_t block_bytes = 0;
  int64_t block_values = 0;
  if (!BlockLayout(type, &block_bytes, &block_values)) {
    return InvalidArgument("cannot dequantise ggml " + GgmlTypeName(type) +
                           " (Gyre reads F32, F16, BF16, Q8_0, Q4_0 and Q4_1)");
  }
  if (count < 0 || count % block_values != 0) {
    return InvalidArgument(std::to_string(count) + " values are not whole " + GgmlTypeName(type) +
                           " blocks of " + std::to_string(block_values));
  }
  const int64_t blocks = count / block_values;
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(count) * 4);
      break;
    case GgmlType::kF16:
      for (int64_t i = 0; i < count; ++i) dst[i] = HalfToFloat(Load16(src + 2 * i));
      break;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < count; ++i) {
        const uint32_t bits = static_cast<uint32_t>(Load16(src + 2 * i)) << 16;
        std::memcpy(dst + i, &bits, 4);
      }
      break;
    case GgmlType::kQ8_0:
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = src + b * block_bytes;
        const float d = HalfToFloat(Load16(blk));
        for (int j = 0; j < 32; ++j) dst[b * 32 + j] = d * static_cast<int8_t>(blk[2 + j]);
      }
      break;
    case GgmlType::kQ4_0:
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = src + b * block_bytes;
        const float d = HalfToFloat(Load16(blk));
        for (int j = 0; j < 16; ++j) {
          dst[b * 32 + j] = d * static_cast<float>((blk[2 + j] & 0x0F) - 8);
          dst[b * 32 + j + 16] = d * static_cast<float>((blk[2 + j] >> 4) - 8);
        }
      }
      break;
    case GgmlType::kQ4_1:
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = src + b * block_bytes;
        const float d = HalfToFloat(Load16(blk)), m = HalfToFloat(Load16(blk + 2));
        for (int j = 0; j < 16; ++j) {
          dst[b * 32 + j] = d * static_cast<float>(blk[4 + j] & 0x0F) + m;
          dst[b * 32 + j + 16] = d * static_cast<float>(blk[4 + j] >> 4) + m;
        }
      }
      break;
  }
  return Status::Ok();
}

GgufFile::~GgufFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound("cannot open " + path + ": " + std::strerror(errno));
  struct stat st = {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + " is not a regular file");
  }
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ < 4) {
    ::close(fd);
    return Status(StatusCode::kDataLoss,
                  path + ": " + std::to_string(f->size_) + " bytes is too short for a GGUF file");
  }
  void* map = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return Unavailable("cannot mmap " + path + ": " + std::strerror(errno));
  f->map_ = map;
  const uint8_t* bytes = static_cast<const uint8_t*>(map);
  Cursor c(bytes, f->size_, path);

  uint32_t magic = 0;
  GYRE_RETURN_IF_ERROR(c.Read(&magic, "magic"));
  if (magic != kMagic) return InvalidArgument(path + " is not a GGUF file (no GGUF magic)");
  GYRE_RETURN_IF_ERROR(c.Read(&f->version_, "version"));
  if (f->version_ != 2 && f->version_ != 3) {
    return InvalidArgument(path + ": GGUF version " + std::to_string(f->version_) +
                           " (Gyre reads versions 2 and 3)");
  }
  uint64_t tensor_count = 0, kv_count = 0;
  GYRE_RETURN_IF_ERROR(c.Read(&tensor_count, "tensor count"));
  GYRE_RETURN_IF_ERROR(c.Read(&kv_count, "metadata count"));
  // Each metadata pair and tensor info takes more than 8 bytes: counts beyond that are lies.
  if (kv_count > f->size_ / 8 || tensor_count > f->size_ / 8) {
    return Status(StatusCode::kDataLoss, path + ": " + std::to_string(kv_count) +
                                             " metadata pairs and " + std::to_string(tensor_count) +
                                             " tensors do not fit in the file");
  }
  for (uint64_t k = 0; k < kv_count; ++k) {
    std::string key;
    GYRE_RETURN_IF_ERROR(c.ReadString(&key, "metadata key"));
    uint32_t type = 0;
    GYRE_RETURN_IF_ERROR(c.Read(&type, "metadata " + key));
    GgufValue v;
    GYRE_RETURN_IF_ERROR(c.ReadValue(type, &v, key, 0));
    if (!f->metadata_.emplace(key, std::move(v)).second) {
      return InvalidArgument(path + ": metadata key " + key + " appears twice");
    }
  }
  uint64_t alignment = 32;
  if (f->metadata_.count("general.alignment")) {
    GYRE_ASSIGN_OR_RETURN(alignment, f->Uint("general.alignment"));
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > 4096) {
      return InvalidArgument(path + ": general.alignment " + std::to_string(alignment) +
                             " is not a power of two up to 4096");
    }
  }
  for (uint64_t t = 0; t < tensor_count; ++t) {
    GgufTensor info;
    GYRE_RETURN_IF_ERROR(c.ReadString(&info.name, "tensor name"));
    uint32_t n_dims = 0;
    GYRE_RETURN_IF_ERROR(c.Read(&n_dims, "tensor " + info.name));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return InvalidArgument(path + ": tensor " + info.name + " has " + std::to_string(n_dims) +
                             " dimensions");
    }
    int64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      GYRE_RETURN_IF_ERROR(c.Read(&dim, "tensor " + info.name));
      if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) /
                                static_cast<uint64_t>(elements)) {
        return InvalidArgument(path + ": tensor " + info.name + " has a bad dimension " +
                               std::to_string(dim));
      }
      elements *= static_cast<int64_t>(dim);
      info.dims.push_back(static_cast<int64_t>(dim));
    }
    info.elements = elements;
    GYRE_RETURN_IF_ERROR(c.Read(&info.type, "tensor " + info.name));
    GYRE_RETURN_IF_ERROR(c.Read(&info.offset, "tensor " + info.name));
    uint64_t block_bytes = 0;
    int64_t block_values = 0;
    if (BlockLayout(info.type, &block_bytes, &block_values)) {
      if (info.dims[0] % block_values != 0) {
        return InvalidArgument(path + ": tensor " + info.name + " (" + GgmlTypeName(info.type) +
                               ") has rows of " + std::to_string(info.dims[0]) +
                               " values, not whole blocks of " + std::to_string(block_values));
      }
      info.bytes = static_cast<uint64_t>(elements / block_values) * block_bytes;
    }
    if (!f->by_name_.emplace(info.name, f->tensors_.size()).second) {
      return InvalidArgument(path + ": tensor " + info.name + " appears twice");
    }
    f->tensors_.push_back(std::move(info));
  }
  const uint64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
  if (data_start > f->size_) {
    return Status(StatusCode::kDataLoss, path + ": truncated GGUF file (no data section)");
  }
  f->data_ = bytes + data_start;
  f->data_size_ = f->size_ - data_start;
  // Every tensor Gyre can read lies inside the data section, without overlapping another.
  std::vector<const GgufTensor*> sorted;
  for (const GgufTensor& t : f->tensors_) {
    if (t.bytes == 0) continue;  // a type Gyre does not read: reported when it is dequantised
    if (t.offset > f->data_size_ || t.bytes > f->data_size_ - t.offset) {
      return Status(StatusCode::kDataLoss,
                    path + ": tensor " + t.name + "'s data [" + std::to_string(t.offset) + ", +" +
                        std::to_string(t.bytes) + ") lies beyond the end of the file");
    }
    sorted.push_back(&t);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i - 1]->offset + sorted[i - 1]->bytes > sorted[i]->offset) {
      return InvalidArgument(path + ": tensors " + sorted[i - 1]->name + " and " + sorted[i]->name +
                             " overlap");
    }
  }
  return f;
}

const GgufTensor* GgufFile::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

StatusOr<std::string> GgufFile::String(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return NotFound(path_ + ": no metadata " + key);
  if (it->second.kind != GgufValue::Kind::kString) {
    return InvalidArgument(path_ + ": metadata " + key + " is not a string");
  }
  return it->second.s;
}

StatusOr<uint64_t> GgufFile::Uint(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return NotFound(path_ + ": no metadata " + key);
  const GgufValue& v = it->second;
  if (v.kind == GgufValue::Kind::kUint) return v.u;
  if (v.kind == GgufValue::Kind::kInt && v.i >= 0) return static_cast<uint64_t>(v.i);
  return InvalidArgument(path_ + ": metadata " + key + " is not a non-negative integer");
}

StatusOr<double> GgufFile::Float(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return NotFound(path_ + ": no metadata " + key);
  const GgufValue& v = it->second;
  if (v.kind == GgufValue::Kind::kFloat) return v.f;
  if (v.kind == GgufValue::Kind::kUint) return static_cast<double>(v.u);
  if (v.kind == GgufValue::Kind::kInt) return static_cast<double>(v.i);
  return InvalidArgument(path_ + ": metadata " + key + " is not a number");
}

StatusOr<std::vector<std::string>> GgufFile::Strings(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return NotFound(path_ + ": no metadata " + key);
  if (it->second.kind != GgufValue::Kind::kArray) {
    return InvalidArgument(path_ + ": metadata " + key + " is not an array");
  }
  std::vector<std::string> out;
  out.reserve(it->second.items.size());
  for (const GgufValue& v : it->second.items) {
    if (v.kind != GgufValue::Kind::kString) {
      return InvalidArgument(path_ + ": metadata " + key + " is not an array of strings");
    }
    out.push_back(v.s);
  }
  return out;
}

Status GgufFile::Dequantize(const GgufTensor& tensor, std::vector<float>* out) const {
  if (tensor.bytes == 0) {
    return InvalidArgument(path_ + ": tensor " + tensor.name + " is ggml " +
                           GgmlTypeName(tensor.type) +
                           " (Gyre reads F32, F16, BF16, Q8_0, Q4_0 and Q4_1)");
  }
  out->resize(static_cast<size_t>(tensor.elements));
  return DequantizeGgml(tensor.type, data_ + tensor.offset, tensor.elements, out->data())
      .WithContext(path_ + ": tensor " + tensor.name);
}

}  // namespace gyre::model
