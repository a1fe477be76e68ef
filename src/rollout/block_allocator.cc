#include "rollout/block_allocator.h"

#include <algorithm>

#include "common/check.h"

namespace gyre::rollout {

BlockAllocator::BlockAllocator(int64_t num_blocks) : refs_(std::max<int64_t>(0, num_blocks), 0) {
  free_.reserve(refs_.size());
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

std::optional<int32_t> BlockAllocator::Allocate() {
  if (free_.empty()) return std::nullopt;
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[b] = 1;
  peak_used_ = std::max(peak_used_, used_blocks());
  return b;
}

void BlockAllocator::Retain(int32_t block) {
  GYRE_CHECK(block >= 0 && block < num_blocks() && refs_[block] > 0)
      << "retain of free or unknown block " << block;
  ++refs_[block];
}

void BlockAllocator::Release(int32_t block) {
  GYRE_CHECK(block >= 0 && block < num_blocks() && refs_[block] > 0)
      << "release of free or unknown block " << block;
  if (--refs_[block] == 0) free_.push_back(block);
}

int32_t BlockAllocator::RefCount(int32_t block) const {
  GYRE_CHECK(block >= 0 && block < num_blocks()) << "unknown block " << block;
  return refs_[block];
}

}  // namespace gyre::rollout
