// Resident shared prefixes with reference counts and an LRU clock
// (docs/semantics.md S6). Block allocation and request bookkeeping stay in the
// cache; this class only keeps the prefix records and picks LRU victims.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fd {

struct Prefix {
  std::vector<int32_t> blocks;  // physical blocks, logical order
  uint32_t ref_count = 0;       // attached active requests
  uint64_t last_use = 0;        // LRU clock value of the last touch
};

struct PrefixCounters {
  uint64_t registration_count = 0;
  uint64_t hit_count = 0;
  uint64_t miss_count = 0;
  uint64_t eviction_count = 0;
  uint64_t capacity_failure_count = 0;
};

class PrefixRegistry {
 public:
  explicit PrefixRegistry(uint32_t capacity_blocks) : capacity_(capacity_blocks) {}

  uint32_t capacity() const { return capacity_; }
  bool enabled() const { return capacity_ > 0; }

  Prefix *find(const std::string &id);
  const Prefix *find(const std::string &id) const;

  // A detached registry entry for `id` with room for `num_blocks` blocks.
  // Built before the cache changes anything, so that inserting it later
  // cannot fail half way (splicing a node handle does not allocate).
  using Node = std::map<std::string, Prefix>::node_type;
  static Node make_node(const std::string &id, uint32_t num_blocks);

  // Inserts a prepared node (its id must be new) and touches it.
  void insert(Node &&node);

  // Removes a prefix; returns its blocks.
  std::vector<int32_t> remove(const std::string &id);

  // Marks `prefix` as the most recently used.
  void touch(Prefix &prefix) { prefix.last_use = ++clock_; }

  // Fills `victims` with unreferenced prefixes, least recently used first,
  // just enough to cover `need` blocks. Returns false (victims empty) when
  // all unreferenced prefixes together cannot cover it.
  bool pick_victims(uint64_t need, std::vector<std::string> *victims) const;

  uint64_t resident_blocks() const;
  const std::map<std::string, Prefix> &all() const { return prefixes_; }
  std::map<std::string, Prefix> &all_for_test() { return prefixes_; }

  PrefixCounters counters;

 private:
  uint32_t capacity_;
  uint64_t clock_ = 0;
  std::map<std::string, Prefix> prefixes_;
};

}  // namespace fd
