#include "cache/block_allocator.hpp"

#include "core/error.hpp"

namespace fd {

BlockAllocator::BlockAllocator(uint32_t max_blocks)
    : max_blocks_(max_blocks), ever_allocated_(max_blocks, 0) {
  stack_.reserve(max_blocks);
  // Reversed: block 0 ends up at the back, i.e. at the front of the free list.
  for (uint32_t i = max_blocks; i > 0; --i) stack_.push_back(static_cast<int32_t>(i - 1));
}

int32_t BlockAllocator::allocate() {
  if (stack_.empty()) fail(FD_ERR_INTERNAL, "block allocator: allocate() with no free block");
  const int32_t block = stack_.back();
  stack_.pop_back();
  ++counters_.allocation_count;
  uint8_t &seen = ever_allocated_[static_cast<size_t>(block)];
  if (seen) {
    ++counters_.reuse_count;
  } else {
    ++counters_.fresh_allocation_count;
    seen = 1;
  }
  return block;
}

void BlockAllocator::release(int32_t block) {
  stack_.push_back(block);  // capacity reserved: never reallocates
  ++counters_.free_count;
}

void BlockAllocator::rollback(const int32_t *blocks, size_t count) {
  // The first allocated block was the front: push it last.
  for (size_t i = count; i > 0; --i) stack_.push_back(blocks[i - 1]);
}

std::vector<int32_t> BlockAllocator::free_list() const {
  return std::vector<int32_t>(stack_.rbegin(), stack_.rend());
}

}  // namespace fd
