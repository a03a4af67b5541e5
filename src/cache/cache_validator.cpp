// Invariant checks of the paged cache (docs/semantics.md S7). Each check returns
// the first violation in words; the empty string means every invariant holds.
#include <algorithm>
#include <string>
#include <vector>

#include "cache/paged_cache.hpp"
#include "core/error.hpp"

namespace fd {

namespace {

unsigned long long ull(uint64_t v) {
  return static_cast<unsigned long long>(v);
}

// Who holds each physical block; used to prove disjointness and coverage.
class Ownership {
 public:
  explicit Ownership(uint32_t max_blocks) : owner_(max_blocks) {}

  // Records that `who` holds `block`; returns a violation or "".
  std::string claim(int32_t block, const std::string &who) {
    if (block < 0 || static_cast<size_t>(block) >= owner_.size())
      return format("%s holds block %d, outside [0, %zu)", who.c_str(), block, owner_.size());
    std::string &o = owner_[static_cast<size_t>(block)];
    if (!o.empty())
      return format("block %d is held by both %s and %s", block, o.c_str(), who.c_str());
    o = who;
    return "";
  }

  std::string uncovered() const {
    for (size_t b = 0; b < owner_.size(); ++b)
      if (owner_[b].empty())
        return format(
            "block %zu is neither free nor held by a request, a prefix or the open "
            "transaction (leaked)",
            b);
    return "";
  }

 private:
  std::vector<std::string> owner_;
};

std::string check_free_list(const CacheState &s) {
  std::vector<uint8_t> seen(s.config.max_blocks, 0);
  for (int32_t b : s.allocator.free_list()) {
    if (b < 0 || static_cast<uint32_t>(b) >= s.config.max_blocks)
      return format("the free list holds block %d, outside [0, %u)", b, s.config.max_blocks);
    if (seen[static_cast<size_t>(b)]) return format("the free list holds block %d twice", b);
    seen[static_cast<size_t>(b)] = 1;
  }
  return "";
}

// Private (request tails and open-transaction blocks), prefix and free blocks
// are pairwise disjoint and cover every block.
std::string check_blocks(const CacheState &s) {
  Ownership own(s.config.max_blocks);
  std::string v;
  for (int32_t b : s.allocator.free_list())
    if (!(v = own.claim(b, "the free list")).empty()) return v;
  uint64_t prefix_total = 0;
  for (const auto &kv : s.prefixes.all()) {
    const std::string who = format("prefix \"%s\"", kv.first.c_str());
    if (kv.second.blocks.empty()) return who + " has no blocks";
    prefix_total += kv.second.blocks.size();
    for (int32_t b : kv.second.blocks)
      if (!(v = own.claim(b, who)).empty()) return v;
  }
  if (prefix_total > s.prefixes.capacity())
    return format("resident prefixes hold %llu blocks, more than the prefix capacity %u",
                  ull(prefix_total), s.prefixes.capacity());
  for (const auto &kv : s.requests.all()) {
    const Request &r = kv.second;
    const std::string who = format("request %llu", ull(kv.first));
    for (size_t i = r.prefix_blocks; i < r.blocks.size(); ++i)
      if (!(v = own.claim(r.blocks[i], who)).empty()) return v;
  }
  if (s.open_tx) {
    const std::string who = format("transaction %llu", ull(s.open_tx->id));
    for (int32_t b : s.open_tx->new_blocks)
      if (!(v = own.claim(b, who)).empty()) return v;
  }
  return own.uncovered();
}

const TxRow *row_of(const CacheState &s, uint64_t id) {
  if (!s.open_tx) return nullptr;
  for (const TxRow &row : s.open_tx->rows)
    if (row.request_id == id) return &row;
  return nullptr;
}

std::string check_requests(const CacheState &s) {
  const uint64_t bs = s.config.block_size;
  uint64_t active = 0, finished = 0, cancelled = 0;
  for (const auto &kv : s.requests.all()) {
    const uint64_t id = kv.first;
    const Request &r = kv.second;
    if (!r.active()) {
      if (r.state == FD_REQUEST_FINISHED)
        ++finished;
      else if (r.state == FD_REQUEST_CANCELLED)
        ++cancelled;
      else
        return format("request %llu has invalid state %d", ull(id), r.state);
      if (!r.blocks.empty() || !r.prefix_id.empty() || r.in_transaction)
        return format("%s request %llu still owns blocks, a prefix or a transaction row",
                      request_state_name(r.state), ull(id));
      continue;
    }
    ++active;
    if (r.seq_len < 0) return format("request %llu has negative seq_len %d", ull(id), r.seq_len);
    const TxRow *row = row_of(s, id);
    if (r.in_transaction != (row != nullptr))
      return format("request %llu is %s the open transaction but its flag says otherwise", ull(id),
                    row ? "in" : "not in");
    const uint64_t pending = row ? row->token_count : 0;
    const uint64_t tokens = static_cast<uint64_t>(r.seq_len) + pending;
    const uint64_t expected = (tokens + bs - 1) / bs;
    const uint64_t owned = r.blocks.size() + (row ? row->new_block_count : 0);
    if (owned != expected)
      return format("request %llu owns %llu blocks, but seq_len %d%s needs %llu", ull(id),
                    ull(owned), r.seq_len,
                    row ? format(" + %llu (open transaction)", ull(pending)).c_str() : "",
                    ull(expected));
    if (r.prefix_id.empty()) {
      if (r.prefix_blocks != 0)
        return format("request %llu has %u prefix blocks but no prefix", ull(id), r.prefix_blocks);
      continue;
    }
    const Prefix *p = s.prefixes.find(r.prefix_id);
    if (p == nullptr)
      return format("request %llu is attached to prefix \"%s\", which is not resident", ull(id),
                    r.prefix_id.c_str());
    if (r.prefix_blocks != p->blocks.size() || r.blocks.size() < p->blocks.size() ||
        !std::equal(p->blocks.begin(), p->blocks.end(), r.blocks.begin()))
      return format("request %llu's first blocks differ from its prefix \"%s\"'s blocks", ull(id),
                    r.prefix_id.c_str());
    if (static_cast<uint64_t>(r.seq_len) < p->blocks.size() * bs)
      return format("request %llu has seq_len %d, shorter than its prefix \"%s\" (%zu tokens)",
                    ull(id), r.seq_len, r.prefix_id.c_str(), p->blocks.size() * bs);
  }
  if (active != s.requests.active_count() || finished != s.requests.finished_count() ||
      cancelled != s.requests.cancelled_count())
    return format(
        "request counters (active %llu, finished %llu, cancelled %llu) do not match "
        "the records (%llu, %llu, %llu)",
        ull(s.requests.active_count()), ull(s.requests.finished_count()),
        ull(s.requests.cancelled_count()), ull(active), ull(finished), ull(cancelled));
  return "";
}

std::string check_prefix_refs(const CacheState &s) {
  for (const auto &kv : s.prefixes.all()) {
    uint64_t attached = 0;
    for (const auto &rq : s.requests.all())
      if (rq.second.active() && rq.second.prefix_id == kv.first) ++attached;
    if (attached != kv.second.ref_count)
      return format("prefix \"%s\" has reference count %u but %llu attached active requests",
                    kv.first.c_str(), kv.second.ref_count, ull(attached));
  }
  return "";
}

std::string check_transaction(const CacheState &s) {
  if (s.history.size() > s.history.limit())
    return format("terminal transaction history holds %zu entries, more than its limit %zu",
                  s.history.size(), s.history.limit());
  if (!s.open_tx) return "";
  const OpenTransaction &t = *s.open_tx;
  if (t.id == 0 || t.id >= s.next_tx_id)
    return format("open transaction has id %llu, not yet issued (next id %llu)", ull(t.id),
                  ull(s.next_tx_id));
  if (t.cache_version > s.state_version)
    return format("open transaction %llu has cache version %llu, newer than the cache's %llu",
                  ull(t.id), ull(t.cache_version), ull(s.state_version));
  if (t.rows.empty()) return format("open transaction %llu has no rows", ull(t.id));
  if (t.next_layer > s.config.num_layers)
    return format("open transaction %llu has written %u layers, more than num_layers %u", ull(t.id),
                  t.next_layer, s.config.num_layers);
  if (t.positions.size() != t.locations.size())
    return format("open transaction %llu holds %zu token positions for %zu token locations",
                  ull(t.id), t.positions.size(), t.locations.size());
  const uint64_t bs = s.config.block_size;
  std::vector<int32_t> new_blocks;
  size_t tokens = 0;
  for (const TxRow &row : t.rows) {
    const Request *r = s.requests.find(row.request_id);
    if (r == nullptr || !r->active())
      return format("open transaction %llu has a row for request %llu, which is not active",
                    ull(t.id), ull(row.request_id));
    if (row_of(s, row.request_id) != &row)
      return format("open transaction %llu lists request %llu twice", ull(t.id),
                    ull(row.request_id));
    if (row.position != r->seq_len)
      return format(
          "open transaction %llu: request %llu's position %d differs from its "
          "seq_len %d",
          ull(t.id), ull(row.request_id), row.position, r->seq_len);
    const uint64_t end = static_cast<uint64_t>(row.position) + row.token_count;
    if (row.token_count == 0 || row.first_token != tokens ||
        row.first_token + uint64_t{row.token_count} > t.locations.size() ||
        row.first_new_block != new_blocks.size() ||
        row.first_new_block + uint64_t{row.new_block_count} > t.new_blocks.size() ||
        row.table_size != (end + bs - 1) / bs ||
        row.table_size != r->blocks.size() + row.new_block_count)
      return format(
          "open transaction %llu: request %llu's %u tokens and %u new blocks do not match its "
          "place in the transaction or what it owns",
          ull(t.id), ull(row.request_id), row.token_count, row.new_block_count);
    tokens += row.token_count;
    // The committed blocks the tokens reach are the row's own; each logical
    // block past them is a new one, taken by its first token: together, in
    // row order, they must be the transaction's new blocks.
    for (uint32_t j = 0; j < row.token_count; ++j) {
      const uint64_t pos = static_cast<uint64_t>(row.position) + j;
      const size_t index = static_cast<size_t>(pos / bs);
      const RowLocation &at = t.locations[row.first_token + j];
      bool ok = t.positions[row.first_token + j] == static_cast<int32_t>(pos) &&
                at.offset == static_cast<int32_t>(pos % bs) &&
                (j > 0 || (row.block == at.block && row.offset == at.offset));
      if (index < r->blocks.size()) {
        ok = ok && at.block == r->blocks[index];
      } else if (pos % bs == 0) {
        new_blocks.push_back(at.block);
      } else {
        ok = ok && !new_blocks.empty() && at.block == new_blocks.back();
      }
      if (!ok)
        return format(
            "open transaction %llu: request %llu's token %u location (block %d, offset %d) does "
            "not match what it owns",
            ull(t.id), ull(row.request_id), j, at.block, at.offset);
    }
  }
  if (tokens != t.locations.size())
    return format("open transaction %llu holds %zu token locations for %zu tokens", ull(t.id),
                  t.locations.size(), tokens);
  if (new_blocks != t.new_blocks)
    return format("open transaction %llu's new blocks differ from its rows' new blocks", ull(t.id));
  return "";
}

}  // namespace

std::string PagedCache::find_invariant_violation() const {
  std::string v;
  if (!(v = check_free_list(s_)).empty()) return v;
  if (!(v = check_blocks(s_)).empty()) return v;
  if (!(v = check_requests(s_)).empty()) return v;
  if (!(v = check_prefix_refs(s_)).empty()) return v;
  return check_transaction(s_);
}

}  // namespace fd
