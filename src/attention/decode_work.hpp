// The decode work list: which attention work items the CUDA kernel runs and
// where each leaves its split-KV partial. The host plan (decode_plan.cpp
// through the CUDA backend's split choice) fills a DecodeWorkList once per
// step; the attention kernel, the merge kernel, the benchmarks and the probes
// read it through these functions, so the split layout is decided in exactly
// one place.
//
// The list is regular: item i is (row, KV head, split) with the split
// fastest, every split of a row covers `tiles_per_split` tiles of
// `tile_tokens` tokens starting at split * tiles_per_split, and the last
// split of a row takes every remaining tile (so a row longer than planned
// costs speed, never tokens). Because it is closed-form, a kernel finds its
// item from blockIdx.x with no memory read, and an empty item (a split past
// its row's end) exits at once. Partial slots are [row, q head, split].
#pragma once

#include <cstdint>

#include "attention/host_device.hpp"

namespace fd {

struct DecodeWorkItem {
  int32_t row;
  int32_t kv_head;
  int32_t split;       // index of the item among its row's splits
  int32_t tile_begin;  // first tile of the item
  bool last_split;     // takes every tile from tile_begin to the row's end
};

struct DecodeWorkList {
  int32_t batch = 0;
  int32_t num_kv_heads = 0;
  int32_t group_size = 0;       // q heads per KV head
  int32_t max_q_len = 1;        // query tokens per row at most (q_indptr rows)
  int32_t tile_tokens = 0;      // tokens per tile
  int32_t num_splits = 1;       // items per (row, KV head); 1: no partials, no merge
  int32_t tiles_per_split = 0;  // tiles of every split but the last

  // Items in the list (the attention kernel's grid).
  FD_HD int64_t size() const { return static_cast<int64_t>(batch) * num_kv_heads * num_splits; }
  FD_HD bool has_partials() const { return num_splits > 1; }
  FD_HD int32_t split_tokens() const { return tiles_per_split * tile_tokens; }

  // Item `index` in [0, size()); the host keeps size() below 2^31 (one
  // CUDA grid), so 32-bit arithmetic suffices.
  FD_HD DecodeWorkItem item(int32_t index) const {
    DecodeWorkItem it;
    it.split = index % num_splits;
    const int32_t rest = index / num_splits;
    it.kv_head = rest % num_kv_heads;
    it.row = rest / num_kv_heads;
    it.tile_begin = it.split * tiles_per_split;
    it.last_split = it.split + 1 == num_splits;
    return it;
  }

  // Tiles item `it` covers in a row of `row_tiles` tiles (<= 0: empty item).
  FD_HD int32_t item_tiles(const DecodeWorkItem &it, int32_t row_tiles) const {
    const int32_t n = row_tiles - it.tile_begin;
    return !it.last_split && n > tiles_per_split ? tiles_per_split : n;
  }

  // Splits of a row of `seq_len` tokens that hold tokens (the merge reads
  // exactly these partial slots, in split order).
  FD_HD int32_t splits_holding(int32_t seq_len) const {
    const int32_t per = split_tokens();
    const int32_t n = (seq_len + per - 1) / per;
    return n > num_splits ? num_splits : n;
  }

  // Query rows of the partial slots: (row, query token j < max_q_len, q
  // head), [batch, max_q_len, num_q_heads] (with one token per row, the
  // row's q head index row * num_q_heads + head).
  FD_HD int64_t query_row(int64_t row, int32_t token, int32_t head) const {
    return (row * max_q_len + token) * (static_cast<int64_t>(num_kv_heads) * group_size) + head;
  }
  FD_HD int64_t query_rows() const {
    return static_cast<int64_t>(batch) * max_q_len * num_kv_heads * group_size;
  }
  // Partial slot of (query row, split): [query rows, num_splits].
  FD_HD int64_t partial_slot(int64_t query_row, int32_t split) const {
    return query_row * num_splits + split;
  }
  FD_HD int64_t partial_slots() const { return query_rows() * num_splits; }
};

// The regular list for `wanted` splits of rows up to `max_len` tokens:
// whole-tile splits, at most `max_splits`, never more than the row has tiles.
inline DecodeWorkList make_decode_work_list(int32_t batch, int32_t num_kv_heads, int32_t group_size,
                                            int32_t tile_tokens, int32_t max_len, int32_t wanted,
                                            int32_t max_splits, int32_t max_q_len = 1) {
  DecodeWorkList w;
  w.max_q_len = max_q_len;
  w.batch = batch;
  w.num_kv_heads = num_kv_heads;
  w.group_size = group_size;
  w.tile_tokens = tile_tokens;
  const int32_t len = max_len > 0 ? max_len : 1;
  const int32_t tiles_total = (len + tile_tokens - 1) / tile_tokens;
  if (wanted > max_splits) wanted = max_splits;
  if (wanted > tiles_total) wanted = tiles_total;
  if (wanted < 1) wanted = 1;
  w.tiles_per_split = (tiles_total + wanted - 1) / wanted;
  w.num_splits = (tiles_total + w.tiles_per_split - 1) / w.tiles_per_split;
  return w;
}

}  // namespace fd
