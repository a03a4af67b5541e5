#include "cache/transaction.hpp"

namespace fd {

void TransactionHistory::push(TerminalTransaction &&entry) noexcept {
  if (count_ < slots_.size()) {
    slots_[(head_ + count_) % slots_.size()] = std::move(entry);
    ++count_;
  } else {
    slots_[head_] = std::move(entry);  // overwrite the oldest
    head_ = (head_ + 1) % slots_.size();
  }
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
