#include "comm/sliced_payload.h"

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/tensor_parallel.h"

namespace gyre::comm {
namespace {

// One tensor of the sliced payload: where its rows lie in the whole payload and which bytes of
// each row the rank keeps.
struct SlicedTensor {
  uint64_t whole_offset = 0;  // the tensor's first byte in the whole payload
  uint64_t row_bytes = 0;     // bytes of one whole row (dimension 0)
  int64_t first_row = 0;      // rows [first_row, end_row) are read
  int64_t end_row = 0;
  uint64_t keep_begin = 0;  // of each row read, bytes [keep_begin, keep_begin + keep_bytes) are
  uint64_t keep_bytes = 0;  // the rank's
};

// A piece: rows [begin, end) of tensor `tensor`.
struct SlicePiece {
  size_t tensor = 0;
  int64_t begin = 0, end = 0;
};

std::string ShapeText(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

std::string TensorParallelWeightGroup(const std::string& group, int rank) {
  return group + "-tp" + std::to_string(rank);
}

StatusOr<WeightPayload> SlicedPayload(const WeightPayload& whole, int reader, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgument("tensor-parallel rank " + std::to_string(rank) + " of " +
                           std::to_string(size));
  }
  const uint64_t total = whole.size();
  std::vector<const model::TensorEntry*> order;
  for (const model::TensorEntry& e : whole.manifest) order.push_back(&e);
  std::sort(order.begin(), order.end(),
            [](const model::TensorEntry* a, const model::TensorEntry* b) {
              return a->offset < b->offset;
            });
  WeightPayload out;
  out.version = whole.version;
  std::vector<SlicedTensor> tensors;
  std::vector<SlicePiece> pieces;
  std::vector<uint64_t> starts;
  uint64_t offset = 0;
  for (const model::TensorEntry* e : order) {
    GYRE_ASSIGN_OR_RETURN(const at::ScalarType dtype, model::ParseWeightDtype(e->dtype));
    const uint64_t element = static_cast<uint64_t>(c10::elementSize(dtype));
    uint64_t numel = 1;
    for (int64_t d : e->shape) numel *= static_cast<uint64_t>(std::max<int64_t>(d, 0));
    if (e->shape.empty() || e->shape.size() > 2 || e->shape[0] <= 0 ||
        e->nbytes != numel * element || e->offset > total || e->nbytes > total - e->offset) {
      return InvalidArgument(e->name + ": shape " + ShapeText(e->shape) + " with " +
                             std::to_string(e->nbytes) + " bytes at offset " +
                             std::to_string(e->offset) + " does not fit a payload of " +
                             std::to_string(total) + " bytes");
    }
    SlicedTensor t;
    t.whole_offset = e->offset;
    t.row_bytes = e->nbytes / static_cast<uint64_t>(e->shape[0]);
    t.first_row = 0;
    t.end_row = e->shape[0];
    t.keep_begin = 0;
    t.keep_bytes = t.row_bytes;
    std::vector<int64_t> shape = e->shape;
    const int dim = model::TensorParallelDim(e->name);
    if (size > 1 && dim >= 0 && dim < static_cast<int>(shape.size())) {
      if (!model::TensorParallelSplits(e->name, shape[dim], size)) {
        return InvalidArgument(e->name + ": " + ShapeText(e->shape) + " does not split over " +
                               std::to_string(size) + " tensor-parallel ranks");
      }
      const auto [begin, end] = model::TensorParallelRange(e->name, shape[dim], rank, size);
      shape[dim] = end - begin;
      if (dim == 0) {
        t.first_row = begin;
        t.end_row = end;
      } else {
        t.keep_begin = static_cast<uint64_t>(begin) * element;
        t.keep_bytes = static_cast<uint64_t>(end - begin) * element;
      }
    }
    model::TensorEntry mine = *e;
    mine.shape = shape;
    mine.offset = offset;
    mine.nbytes = static_cast<uint64_t>(t.end_row - t.first_row) * t.keep_bytes;
    // Pieces of whole rows, each reading at most kSlicePieceBytes of the whole payload.
    const int64_t rows_per_piece = std::max<int64_t>(
        1, static_cast<int64_t>(kSlicePieceBytes / std::max<uint64_t>(t.row_bytes, 1)));
    // (None for a rank's empty share: a piece of no bytes would repeat a start.)
    for (int64_t r = t.first_row; t.keep_bytes > 0 && r < t.end_row; r += rows_per_piece) {
      starts.push_back(offset + static_cast<uint64_t>(r - t.first_row) * t.keep_bytes);
      pieces.push_back({tensors.size(), r, std::min(t.end_row, r + rows_per_piece)});
    }
    offset += mine.nbytes;
    tensors.push_back(t);
    out.manifest.push_back(std::move(mine));
  }
  if (pieces.empty()) return InvalidArgument("the version has no bytes to slice");
  const WeightPayload* source = &whole;
  auto produce = [source, reader, tensors = std::move(tensors), pieces = std::move(pieces),
                  scratch = std::make_shared<std::vector<uint8_t>>()](
                     size_t index, std::vector<uint8_t>* bytes) -> Status {
    const SlicePiece& p = pieces[index];
    const SlicedTensor& t = tensors[p.tensor];
    const uint64_t rows = static_cast<uint64_t>(p.end - p.begin);
    GYRE_ASSIGN_OR_RETURN(
        const uint8_t* src,
        PayloadBytes(*source, reader, t.whole_offset + static_cast<uint64_t>(p.begin) * t.row_bytes,
                     rows * t.row_bytes, scratch.get()));
    bytes->resize(rows * t.keep_bytes);
    if (t.keep_bytes == t.row_bytes) {
      std::memcpy(bytes->data(), src, bytes->size());
    } else {
      for (uint64_t r = 0; r < rows; ++r) {
        std::memcpy(bytes->data() + r * t.keep_bytes, src + r * t.row_bytes + t.keep_begin,
                    t.keep_bytes);
      }
    }
    return Status::Ok();
  };
  out.stream = std::make_shared<PayloadStream>(offset, std::move(starts), std::move(produce),
                                               /*readers=*/1);
  return out;
}

}  // namespace gyre::comm
