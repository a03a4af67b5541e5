// Request records of the paged KV cache (docs/semantics.md S4.3).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "flashdec.h"

namespace fd {

struct Request {
  int32_t state = FD_REQUEST_ACTIVE;  // an fd_request_state value
  int32_t seq_len = 0;                // committed tokens
  // Physical blocks in logical order: the prefix's blocks first (when
  // attached), then private ones. An open transaction's new block is kept in
  // the transaction until commit.
  std::vector<int32_t> blocks;
  std::string prefix_id;        // empty: no prefix attached
  uint32_t prefix_blocks = 0;   // leading entries of `blocks` owned by the prefix
  bool in_transaction = false;  // a row of the open transaction
  // Scratch of the cache's duplicate check (PagedCache::check_unique): the
  // mark of the last id list that contained this request. Not state.
  uint64_t id_check_mark = 0;

  bool active() const { return state == FD_REQUEST_ACTIVE; }
};

class RequestTable {
 public:
  Request *find(uint64_t id);
  const Request *find(uint64_t id) const;

  // Inserts a new active request; the id must be unknown.
  Request &add(uint64_t id);

  // Moves an active request to a terminal state and drops what it owned. The
  // caller has released its blocks and prefix reference.
  void close(Request &request, int32_t terminal_state);

  // Erases an active request's record as if it had never been added (the
  // undo of add; see PagedCache::discard_new_request). Never fails.
  void erase_active(uint64_t id) noexcept;

  uint64_t active_count() const { return active_; }
  uint64_t finished_count() const { return finished_; }
  uint64_t cancelled_count() const { return cancelled_; }

  const std::unordered_map<uint64_t, Request> &all() const { return requests_; }
  // Internal test hook.
  std::unordered_map<uint64_t, Request> &all_for_test() { return requests_; }

 private:
  // Terminal records are kept forever: terminal states are permanent.
  std::unordered_map<uint64_t, Request> requests_;
  uint64_t active_ = 0;
  uint64_t finished_ = 0;
  uint64_t cancelled_ = 0;
};

// "active", "finished", "cancelled" or "unknown".
const char *request_state_name(int32_t state);

}  // namespace fd
