#include "cache/prefix_registry.hpp"

#include <algorithm>
#include <utility>

namespace fd {

Prefix *PrefixRegistry::find(const std::string &id) {
  auto it = prefixes_.find(id);
  return it == prefixes_.end() ? nullptr : &it->second;
}

const Prefix *PrefixRegistry::find(const std::string &id) const {
  auto it = prefixes_.find(id);
  return it == prefixes_.end() ? nullptr : &it->second;
}

PrefixRegistry::Node PrefixRegistry::make_node(const std::string &id, uint32_t num_blocks) {
  std::map<std::string, Prefix> scratch;
  scratch.emplace(id, Prefix{});
  Node node = scratch.extract(scratch.begin());
  node.mapped().blocks.reserve(num_blocks);
  return node;
}

void PrefixRegistry::insert(Node &&node) {
  touch(node.mapped());
  prefixes_.insert(std::move(node));
}

std::vector<int32_t> PrefixRegistry::remove(const std::string &id) {
  auto it = prefixes_.find(id);
  std::vector<int32_t> blocks = std::move(it->second.blocks);
  prefixes_.erase(it);
  return blocks;
}

bool PrefixRegistry::pick_victims(uint64_t need, std::vector<std::string> *victims) const {
  victims->clear();
  if (need == 0) return true;
  std::vector<std::pair<uint64_t, const std::string *>> idle;
  for (const auto &kv : prefixes_)
    if (kv.second.ref_count == 0) idle.emplace_back(kv.second.last_use, &kv.first);
  std::sort(idle.begin(), idle.end());  // clock values are unique
  uint64_t covered = 0;
  for (const auto &e : idle) {
    if (covered >= need) break;
    victims->push_back(*e.second);
    covered += prefixes_.at(*e.second).blocks.size();
  }
  if (covered >= need) return true;
  victims->clear();
  return false;
}

uint64_t PrefixRegistry::resident_blocks() const {
  uint64_t n = 0;
  for (const auto &kv : prefixes_) n += kv.second.blocks.size();
  return n;
}

}  // namespace fd
