// The open multi-layer token transaction and the bounded history of terminal
// transactions (docs/semantics.md S5).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cache/kv_storage.hpp"
#include "flashdec.h"

namespace fd {

// One row of a transaction: where the request's new tokens go. Computed by
// the cache at begin and never read from caller memory afterwards.
struct Request;

struct TxRow {
  uint64_t request_id = 0;
  // The row's request record (records are never erased and none is added
  // while a transaction is open, so the pointer stays valid until it ends).
  Request *request = nullptr;
  int32_t position = 0;          // committed seq_len at begin: the first new position
  int32_t block = 0;             // physical block of the first new token
  int32_t offset = 0;            // position % block_size
  uint32_t token_count = 1;      // new tokens (k >= 1), positions position .. position + k - 1
  uint32_t first_token = 0;      // index of the first of them in the transaction's token arrays
  uint32_t new_block_count = 0;  // blocks this row gets from this transaction
  uint32_t first_new_block = 0;  // index of the first of them in OpenTransaction::new_blocks
  uint32_t table_size = 0;       // blocks of the row including the new ones
};

struct OpenTransaction {
  uint64_t id = 0;
  uint64_t cache_version = 0;       // state_version right after begin
  std::vector<TxRow> rows;          // in begin's order
  std::vector<int32_t> new_blocks;  // in allocation order: row by row, logical order in a row
  uint32_t next_layer = 0;
  // One entry per new token, rows packed in begin's order (the order of the
  // layer writes' K/V/Q): destinations and positions in the form the storage
  // takes, built once at begin (not per layer write).
  std::vector<RowLocation> locations;
  std::vector<int32_t> positions;
};

struct TerminalTransaction {
  uint64_t id = 0;
  uint64_t cache_version = 0;
  std::vector<uint64_t> request_ids;
  int32_t state = FD_TX_COMMITTED;  // FD_TX_COMMITTED or FD_TX_ABORTED
};

// Ring buffer of the most recent terminal transactions. Its slots are
// allocated up front so that recording a transaction never allocates (commit
// and abort must not fail half way).
class TransactionHistory {
 public:
  static constexpr size_t kLimit = 256;

  TransactionHistory() : slots_(kLimit) {}

  size_t size() const { return count_; }
  size_t limit() const { return slots_.size(); }

  // Records `entry`, dropping the oldest when full. Never throws.
  void push(TerminalTransaction &&entry) noexcept;

  // Makes room for `rows` request ids in the slot that the next record()
  // fills, so that record() cannot fail. May throw std::bad_alloc; changes
  // nothing observable (the slot's current entry, if any, is kept).
  void reserve_next(size_t rows);

  // Records a terminal transaction with the request ids of `rows`, dropping
  // the oldest when full. Reuses the slot's memory (no allocation after
  // reserve_next(rows.size())).
  void record(uint64_t id, uint64_t cache_version, int32_t state,
              const std::vector<TxRow> &rows) noexcept;

  // The entry with transaction id `id`, or nullptr when not (or no longer) kept.
  const TerminalTransaction *find(uint64_t id) const;

  // Internal test hook: pretend to hold `count` entries.
  void set_size_for_test(size_t count) { count_ = count; }

 private:
  // The slot the next push/record fills, and the bookkeeping after filling it.
  size_t next_index() const;
  void advance() noexcept;

  std::vector<TerminalTransaction> slots_;
  size_t head_ = 0;   // index of the oldest entry
  size_t count_ = 0;  // entries held
};

const char *tx_state_name(int32_t state);

}  // namespace fd
