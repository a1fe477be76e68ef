#pragma once
// BlockAllocator: hands out the blocks of a paged KV cache (model/transformer.h PagedKvCache) by
// index, with reference counts so several sequences can share a block (the prompt blocks of one
// group's n samples). A block returns to the free list when its last reference is released.
//
// Not thread-safe: owned and called by one RolloutEngine.

#include <cstdint>
#include <optional>
#include <vector>

namespace gyre::rollout {

class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks);

  // A free block with one reference, or nothing when every block is in use.
  std::optional<int32_t> Allocate();
  // Adds a reference to an allocated block.
  void Retain(int32_t block);
  // Drops a reference; the block is free again when none are left.
  void Release(int32_t block);

  int32_t RefCount(int32_t block) const;
  int64_t num_blocks() const { return static_cast<int64_t>(refs_.size()); }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return num_blocks() - free_blocks(); }
  // Most blocks ever in use at once.
  int64_t peak_used_blocks() const { return peak_used_; }
  void ResetPeak() { peak_used_ = used_blocks(); }

 private:
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
  int64_t peak_used_ = 0;
};

}  // namespace gyre::rollout
