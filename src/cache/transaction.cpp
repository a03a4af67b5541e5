#include "cache/transaction.hpp"

namespace fd {

size_t TransactionHistory::next_index() const {
  // When full, the oldest entry is overwritten.
  return count_ < slots_.size() ? (head_ + count_) % slots_.size() : head_;
}

void TransactionHistory::advance() noexcept {
  if (count_ < slots_.size())
    ++count_;
  else
    head_ = (head_ + 1) % slots_.size();  // the oldest was overwritten
}

void TransactionHistory::push(TerminalTransaction &&entry) noexcept {
  slots_[next_index()] = std::move(entry);
  advance();
}

void TransactionHistory::reserve_next(size_t rows) {
  slots_[next_index()].request_ids.reserve(rows);
}

void TransactionHistory::record(uint64_t id, uint64_t cache_version, int32_t state,
                                const std::vector<TxRow> &rows) noexcept {
  TerminalTransaction &e = slots_[next_index()];
  e.id = id;
  e.cache_version = cache_version;
  e.state = state;
  // Capacity reserved by reserve_next: assigning does not allocate.
  e.request_ids.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) e.request_ids[i] = rows[i].request_id;
  advance();
}

const TerminalTransaction *TransactionHistory::find(uint64_t id) const {
  for (size_t i = 0; i < count_ && i < slots_.size(); ++i) {
    const TerminalTransaction &e = slots_[(head_ + i) % slots_.size()];
    if (e.id == id) return &e;
  }
  return nullptr;
}

const char *tx_state_name(int32_t state) {
  switch (state) {
    case FD_TX_OPEN: return "open";
    case FD_TX_COMMITTED: return "committed";
    case FD_TX_ABORTED: return "aborted";
    default: return "unknown";
  }
}

}  // namespace fd
