// The decode work list: which attention work items the CUDA kernel runs and
// where each leaves its split-KV partial. The host plan (decode_plan.cpp
// through the CUDA backend's split choice) fills a DecodeWorkList once per
// step; the attention kernel, the merge kernel, the benchmarks and the probes
// read it through these functions, so the split layout is decided in exactly
// one place.
//
// The list is closed-form: item i is (query tile, row, KV head, split) with
// the split fastest, every split of a unit (query tile, row, KV head) covers
// `tiles_per_split` tiles of `tile_tokens` tokens starting at split *
// tiles_per_split, and the last split of a row takes every remaining tile (so
// a row longer than planned costs speed, never tokens). The first
// `lead_units` units may take another split count (`lead_splits` of
// `lead_tiles_per_split` tiles): whole waves of lead items, then the other
// units cut finer to fill the last wave. A unit of one split writes its
// output; the others write partials that the merge kernel combines. Because
// it is closed-form, a kernel finds its item from blockIdx.x with no memory
// read, and an empty item (a split past its row's end) exits at once.
// Partial slots are [row, query token, q head, slot_splits()].
//
// Query tiles (several query tokens per row, q_indptr): a row's query tokens
// are cut into tiles of `q_tile_tokens` tokens counted from the row's last
// token back, so tile k holds tokens [q_len - (k + 1) T, q_len - k T) (the
// first one may be shorter) and sees keys below seq_len - k T (causal). Tile 0
// is the heaviest tile of every row and the only one of a short row; the
// tiles are the slowest index of the list, so the heavy ones start first and
// a row shorter than the plan's longest leaves only empty items (they exit at
// once) in the later tiles. With q_tiles == 1 the list is the one of plain
// decode.
//
// Sliding window (attention/variant.hpp): a (row, query tile) sees keys only
// from the first position its earliest query token sees, so its tiles are
// counted from the tile holding that position (first_key_tile), not from 0:
// the splits cover only the visible span and the tiles before it are never
// copied or walked. The span is recomputed from each run's window and the
// device lengths, so the plan (which sizes tiles_per_split from the longest
// span it knows) stays correct for any run; a longer span costs speed.
#pragma once

#include <cstdint>

#include "core/host_device.hpp"
#include "attention/variant.hpp"

namespace fd {

struct DecodeWorkItem {
  int32_t row;
  int32_t kv_head;
  int32_t q_tile;           // query tile, counted from the row's last token (0 with q_tiles == 1)
  int32_t split;            // index of the item among its row's splits
  int32_t splits;           // items of its (query tile, row, KV head); 1: no partial
  int32_t tiles_per_split;  // tiles of each of them but the last
  int32_t tile_begin;       // first tile of the item
  bool last_split;          // takes every tile from tile_begin to the row's end
};

struct DecodeWorkList {
  int32_t batch = 0;
  int32_t num_kv_heads = 0;
  int32_t group_size = 0;       // q heads per KV head
  int32_t max_q_len = 1;        // query tokens per row at most (q_indptr rows)
  int32_t q_tile_tokens = 1;    // query tokens per query tile (max_q_len when q_tiles == 1)
  int32_t q_tiles = 1;          // query tiles per (row, KV head)
  int32_t tile_tokens = 0;      // tokens per tile
  int32_t num_splits = 1;       // items per (row, KV head) past the lead units; 1: none
  int32_t tiles_per_split = 0;  // tiles of every split but the last
  // Lead units: the first `lead_units` units (query tile, row, KV head), in
  // item order, take `lead_splits` splits of `lead_tiles_per_split` tiles
  // instead (0: every unit takes num_splits). The host plans whole waves of
  // lead items and cuts the remaining units finer so that they fill the
  // last wave (decode_splits.cpp, choose_splits).
  int32_t lead_units = 0;
  int32_t lead_splits = 1;
  int32_t lead_tiles_per_split = 0;
  // Planned on a device of compute capability 9.0 (CUDA plan): the runs the
  // Hopper kernel serves take it (attention/sm90_choice.hpp), and the splits
  // were sized by its CTAs per SM. Read once by the plan, not per run.
  bool sm90_device = false;
  // The CUDA plan chose the deeper-pipelined CTA shape (head_dim 128 over
  // 16-bit K/V, token-major, one query token per row: 3 stages x 2 CTAs per
  // SM instead of 2 x 3) because the list has at most 2 items per SM, each
  // of several tiles. A shape only: every item is the same either way, and a
  // run with an attention variant takes the regular shape.
  bool deep_stages = false;
  // The CUDA plan chose TMA staging for the swapped FP8 kernel (FP8 K/V,
  // token-major, one query token per row, groups of at most 8 heads, a
  // compute capability 9.0 device) because its grid fits one wave and every
  // item walks at most kDecodeTmaMaxTiles tiles: a CTA's first tile arrives
  // sooner (no per-thread copy addressing), while long items stream faster
  // with cp.async. A staging only: a run whose cache strides TMA cannot
  // describe, or with an attention variant, takes another kernel.
  bool tma_stages = false;

  FD_HD int64_t units() const { return static_cast<int64_t>(q_tiles) * batch * num_kv_heads; }
  // Items in the list (the attention kernel's grid).
  FD_HD int64_t size() const {
    return static_cast<int64_t>(lead_units) * lead_splits + (units() - lead_units) * num_splits;
  }
  // Partial slots per query row: the most splits any unit has.
  FD_HD int32_t slot_splits() const { return num_splits > lead_splits ? num_splits : lead_splits; }
  FD_HD bool has_partials() const { return slot_splits() > 1; }
  // Splits and tiles per split of unit u ((query tile x batch + row) x KV
  // heads + KV head).
  FD_HD int32_t unit_splits(int64_t u) const { return u < lead_units ? lead_splits : num_splits; }
  FD_HD int32_t unit_split_tokens(int64_t u) const {
    return (u < lead_units ? lead_tiles_per_split : tiles_per_split) * tile_tokens;
  }

  // Whether item `index` writes a partial (its unit has several splits)
  // rather than the output; from the index alone, so a kernel keeps no
  // register for it.
  FD_HD bool item_has_partial(int32_t index) const {
    return (index < lead_units * lead_splits ? lead_splits : num_splits) > 1;
  }

  // Item `index` in [0, size()); the host keeps size() below 2^31 (one
  // CUDA grid), so 32-bit arithmetic suffices. kTiled false: the caller
  // knows q_tiles == 1 (the one-token kernel) and skips that index.
  template <bool kTiled = true>
  FD_HD DecodeWorkItem item(int32_t index) const {
    DecodeWorkItem it;
    const int32_t lead_items = lead_units * lead_splits;
    int32_t unit;
    if (index < lead_items) {
      it.splits = lead_splits;
      it.tiles_per_split = lead_tiles_per_split;
      unit = index / lead_splits;
      it.split = index % lead_splits;
    } else {
      it.splits = num_splits;
      it.tiles_per_split = tiles_per_split;
      unit = lead_units + (index - lead_items) / num_splits;
      it.split = (index - lead_items) % num_splits;
    }
    it.kv_head = unit % num_kv_heads;
    if (kTiled) {
      const int32_t rows = unit / num_kv_heads;
      it.row = rows % batch;
      it.q_tile = rows / batch;
    } else {
      it.row = unit / num_kv_heads;
      it.q_tile = 0;
    }
    it.tile_begin = it.split * it.tiles_per_split;
    it.last_split = it.split + 1 == it.splits;
    return it;
  }

  // One past the last query token of query tile k in a row of q_len tokens
  // (<= 0: the tile is empty); the tile starts at max(0, end - q_tile_tokens).
  FD_HD int32_t q_tile_end(int32_t q_len, int32_t k) const { return q_len - k * q_tile_tokens; }
  // First query token of query tile k (0 for the row's first tile).
  FD_HD int32_t q_tile_begin(int32_t q_len, int32_t k) const {
    const int32_t b = q_tile_end(q_len, k) - q_tile_tokens;
    return b < 0 ? 0 : b;
  }
  // The query tile holding token j (0 <= j < q_len) of a row of q_len tokens.
  FD_HD int32_t q_tile_of(int32_t q_len, int32_t j) const {
    return (q_len - 1 - j) / q_tile_tokens;
  }
  // Keys query tile k of a row sees: positions below seq_len - k T (its last
  // token's causal limit), at least 0.
  FD_HD int32_t q_tile_keys(int32_t seq_len, int32_t k) const {
    const int32_t n = seq_len - k * q_tile_tokens;
    return n < 0 ? 0 : n;
  }

  // First tile of the keys that query tokens j0.. of a row of seq_len keys
  // and q_len query tokens see: the tile holding the first position token
  // j0 (at seq_len - q_len + j0) attends; 0 without a sliding window.
  FD_HD int32_t first_key_tile(const VariantPolicy &v, int32_t seq_len, int32_t q_len,
                               int32_t j0) const {
    return static_cast<int32_t>(v.first_visible(int64_t{seq_len} - q_len + j0) / tile_tokens);
  }
  // Tokens of query tile k's key span, from its first key tile to its causal
  // limit (the keys its items cover, split by split).
  FD_HD int32_t q_tile_span(const VariantPolicy &v, int32_t seq_len, int32_t q_len,
                            int32_t k) const {
    const int32_t span = q_tile_keys(seq_len, k) -
                         first_key_tile(v, seq_len, q_len, q_tile_begin(q_len, k)) * tile_tokens;
    return span < 0 ? 0 : span;
  }

  // Tiles item `it` covers in a row of `row_tiles` tiles (<= 0: empty item).
  FD_HD int32_t item_tiles(const DecodeWorkItem &it, int32_t row_tiles) const {
    const int32_t n = row_tiles - it.tile_begin;
    return !it.last_split && n > it.tiles_per_split ? it.tiles_per_split : n;
  }

  // Splits of unit u's key span of `seq_len` tokens that hold tokens (the
  // merge reads exactly these partial slots, in split order).
  FD_HD int32_t splits_holding(int32_t seq_len, int64_t u) const {
    const int32_t per = unit_split_tokens(u);
    const int32_t splits = unit_splits(u);
    const int32_t n = (seq_len + per - 1) / per;
    return n > splits ? splits : n;
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
  // Partial slot of (query row, split): [query rows, slot_splits()].
  FD_HD int64_t partial_slot(int64_t query_row, int32_t split) const {
    return query_row * slot_splits() + split;
  }
  FD_HD int64_t partial_slots() const { return query_rows() * slot_splits(); }
};

// The regular list for `wanted` splits of rows up to `max_len` tokens:
// whole-tile splits, at most `max_splits`, never more than the row has tiles.
// Query tiles of `q_tile_tokens` tokens (0: one tile of max_q_len tokens).
inline DecodeWorkList make_decode_work_list(int32_t batch, int32_t num_kv_heads, int32_t group_size,
                                            int32_t tile_tokens, int32_t max_len, int32_t wanted,
                                            int32_t max_splits, int32_t max_q_len = 1,
                                            int32_t q_tile_tokens = 0) {
  DecodeWorkList w;
  w.max_q_len = max_q_len;
  w.q_tile_tokens = q_tile_tokens > 0 && q_tile_tokens < max_q_len ? q_tile_tokens : max_q_len;
  w.q_tiles = (max_q_len + w.q_tile_tokens - 1) / w.q_tile_tokens;
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

// `tail` (the layout of the units after the lead ones) with its first
// `lead_units` units taking `lead`'s splits instead (decode_splits.cpp plans
// lead = the list of one split, tail = a finer one).
inline DecodeWorkList lead_list(DecodeWorkList tail, const DecodeWorkList &lead,
                                int32_t lead_units) {
  tail.lead_units = lead_units;
  tail.lead_splits = lead.num_splits;
  tail.lead_tiles_per_split = lead.tiles_per_split;
  return tail;
}

// The longest key span a plan counts for a row of `len` keys (the split
// layout's length): with a sliding window, from the tile holding the first
// position the row's heaviest query tile can see (its earliest token at
// len - min(max_q_len, q_tile_tokens) at the latest), else the whole row.
inline int32_t planned_span(const VariantPolicy &v, int32_t len, int32_t max_q_len,
                            int32_t q_tile_tokens, int32_t tile_tokens) {
  if (v.window <= 0 || len <= 0) return len;
  const int32_t q = max_q_len < q_tile_tokens || q_tile_tokens <= 0 ? max_q_len : q_tile_tokens;
  const int64_t first = v.first_visible(int64_t{len} - q) / tile_tokens * tile_tokens;
  return static_cast<int32_t>(len - first);
}

}  // namespace fd
