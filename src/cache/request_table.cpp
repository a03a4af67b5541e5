#include "cache/request_table.hpp"

namespace fd {

Request *RequestTable::find(uint64_t id) {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second;
}

const Request *RequestTable::find(uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second;
}

Request &RequestTable::add(uint64_t id) {
  Request &r = requests_[id];
  ++active_;
  return r;
}

void RequestTable::close(Request &request, int32_t terminal_state) {
  request.state = terminal_state;
  request.seq_len = 0;
  request.blocks.clear();
  request.blocks.shrink_to_fit();  // terminal records are kept forever: keep them small
  request.prefix_id.clear();
  request.prefix_blocks = 0;
  request.in_transaction = false;
  --active_;
  if (terminal_state == FD_REQUEST_FINISHED)
    ++finished_;
  else
    ++cancelled_;
}

void RequestTable::erase_active(uint64_t id) noexcept {
  if (requests_.erase(id) != 0) --active_;
}

const char *request_state_name(int32_t state) {
  switch (state) {
    case FD_REQUEST_ACTIVE: return "active";
    case FD_REQUEST_FINISHED: return "finished";
    case FD_REQUEST_CANCELLED: return "cancelled";
    default: return "unknown";
  }
}

}  // namespace fd
