// Physical block allocator of the paged KV cache (docs/semantics.md S4.2).
//
// The free list starts as 0..max_blocks-1 and allocation takes from its front.
// Released blocks go back to the front, so the most recently released block is
// reused first; a rolled-back allocation restores the exact previous order.
// The list is stored reversed in a vector reserved to max_blocks (front = back
// of the vector), so every operation after construction is O(1) per block and
// never allocates: callers can mutate after validating without a bad_alloc
// half way through.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fd {

struct AllocatorCounters {
  uint64_t allocation_count = 0;        // blocks taken from the free list
  uint64_t fresh_allocation_count = 0;  // ... that had never been allocated before
  uint64_t reuse_count = 0;             // ... that had been allocated before
  uint64_t free_count = 0;              // blocks released (not rollbacks)
  uint64_t capacity_failure_count = 0;  // calls refused for lack of blocks
};

class BlockAllocator {
 public:
  // Host bytes the allocator holds per block from construction on (the
  // free list's int32 slot and the allocated-once mark): what
  // fd_cache_create checks against the machine's memory before building it.
  static constexpr size_t kBytesPerBlock = sizeof(int32_t) + sizeof(uint8_t);

  explicit BlockAllocator(uint32_t max_blocks);

  uint32_t max_blocks() const { return max_blocks_; }
  uint32_t free_blocks() const { return static_cast<uint32_t>(stack_.size()); }
  const AllocatorCounters &counters() const { return counters_; }

  // Takes the front block. The caller has checked free_blocks() > 0.
  int32_t allocate();

  // The block `index` places behind the front of the free list (0 = front),
  // i.e. the one the (index+1)-th next allocate() returns. index < free_blocks().
  int32_t peek(size_t index) const { return stack_[stack_.size() - 1 - index]; }

  // Returns a block released by finish/cancel/eviction to the front.
  void release(int32_t block);

  // Undoes allocations: `blocks` in the order they were allocated (nothing
  // else may have touched the list since). Counters are not changed.
  void rollback(const std::vector<int32_t> &blocks) { rollback(blocks.data(), blocks.size()); }
  // The same for `count` blocks at `blocks`, in allocation order. Rolling
  // back several runs of one allocation, the later runs first, puts them all
  // back in allocation order (a partial rollback: the runs need not be
  // adjacent in that allocation).
  void rollback(const int32_t *blocks, size_t count);

  void record_capacity_failure() { ++counters_.capacity_failure_count; }

  // Free list in allocation order (front first).
  std::vector<int32_t> free_list() const;

  // Internal test hook: the reversed free list (back = front), to corrupt it.
  std::vector<int32_t> &reversed_free_list_for_test() { return stack_; }

 private:
  uint32_t max_blocks_;
  // kBytesPerBlock counts the two per-block vectors below.
  std::vector<int32_t> stack_;           // reversed free list: back() is the front
  std::vector<uint8_t> ever_allocated_;  // per block: allocated at least once
  AllocatorCounters counters_;
};

}  // namespace fd
