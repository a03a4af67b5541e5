/* The decode work list (src/attention/decode_work.hpp), the split layout the
 * CUDA kernels read, checked on the CPU: regular lists from
 * make_decode_work_list and lists with lead units (whole waves of units of
 * their own split count, issue 17). For every unit: its items carry splits
 * 0..n-1 in order, partial-or-output agrees with its split count, and for
 * every row length (shorter than planned, exact, longer) its non-empty items
 * cover the row's tiles exactly once, in order, as many of them as
 * splits_holding() says the merge reads; every (query row, split) partial
 * slot is distinct and inside partial_slots(). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <set>
#include <vector>

#include "attention/decode_work.hpp"
#include "fd_test.h"

namespace {

using fd::DecodeWorkItem;
using fd::DecodeWorkList;

int64_t unit_of(const DecodeWorkList &w, const DecodeWorkItem &it) {
  return (static_cast<int64_t>(it.q_tile) * w.batch + it.row) * w.num_kv_heads + it.kv_head;
}

void check_list(const DecodeWorkList &w, int32_t planned_tiles) {
  std::vector<std::vector<DecodeWorkItem>> units(static_cast<size_t>(w.units()));
  assert_true(w.size() < (int64_t{1} << 31));
  for (int32_t i = 0; i < static_cast<int32_t>(w.size()); ++i) {
    const DecodeWorkItem it = w.item(i);
    const int64_t u = unit_of(w, it);
    assert_true(u >= 0 && u < w.units());
    assert_int_equal(it.splits, w.unit_splits(u));
    assert_int_equal(it.tiles_per_split * w.tile_tokens, w.unit_split_tokens(u));
    assert_int_equal(w.item_has_partial(i), it.splits > 1);
    if (w.q_tiles == 1) {  // the one-token kernel's shortcut names the same item
      const DecodeWorkItem flat = w.item<false>(i);
      assert_int_equal(flat.row, it.row);
      assert_int_equal(flat.kv_head, it.kv_head);
      assert_int_equal(flat.split, it.split);
    }
    units[static_cast<size_t>(u)].push_back(it);
  }
  for (int64_t u = 0; u < w.units(); ++u) {
    const std::vector<DecodeWorkItem> &items = units[static_cast<size_t>(u)];
    assert_int_equal(items.size(), w.unit_splits(u));
    for (size_t s = 0; s < items.size(); ++s) {
      assert_int_equal(items[s].split, s);
      assert_int_equal(items[s].last_split, s + 1 == items.size());
      assert_int_equal(items[s].tile_begin, static_cast<int32_t>(s) * items[s].tiles_per_split);
    }
    for (int32_t row_tiles = 0; row_tiles <= planned_tiles + 3; ++row_tiles) {
      int32_t next = 0, holding = 0;
      for (const DecodeWorkItem &it : items) {
        const int32_t n = w.item_tiles(it, row_tiles);
        if (n <= 0) continue;
        assert_int_equal(it.tile_begin, next);
        next += n;
        ++holding;
      }
      assert_int_equal(next, row_tiles);
      if (row_tiles > 0) assert_int_equal(w.splits_holding(row_tiles * w.tile_tokens, u), holding);
    }
  }
  std::set<int64_t> slots;
  const int32_t heads = w.num_kv_heads * w.group_size;
  for (int64_t row = 0; row < w.batch; ++row)
    for (int32_t token = 0; token < w.max_q_len; ++token)
      for (int32_t head = 0; head < heads; ++head)
        for (int32_t split = 0; split < w.slot_splits(); ++split) {
          const int64_t slot = w.partial_slot(w.query_row(row, token, head), split);
          assert_true(slot >= 0 && slot < w.partial_slots());
          assert_true(slots.insert(slot).second);
        }
}

// A regular list of `wanted` splits with its first `lead` units taking the
// split layout of a list of `lead_splits` splits (fd::lead_list, as
// decode_splits.cpp's choose_splits builds them).
DecodeWorkList with_lead(int32_t batch, int32_t heads, int32_t tile, int32_t len, int32_t wanted,
                         int32_t lead, int32_t lead_splits, int32_t max_q = 1, int32_t q_tile = 0) {
  return fd::lead_list(
      fd::make_decode_work_list(batch, heads, 8, tile, len, wanted, 128, max_q, q_tile),
      fd::make_decode_work_list(batch, heads, 8, tile, len, lead_splits, 128, max_q, q_tile), lead);
}

void test_regular_lists(void **state) {
  (void)state;
  for (int32_t len : {1, 64, 65, 1000, 4096})
    for (int32_t wanted : {1, 2, 3, 7, 200}) {
      const DecodeWorkList w = fd::make_decode_work_list(3, 2, 8, 64, len, wanted, 128);
      assert_true(w.num_splits >= 1 && w.num_splits <= 128);
      assert_int_equal(w.size(), w.units() * w.num_splits);
      assert_int_equal(w.lead_units, 0);
      check_list(w, (len + 63) / 64);
    }
}

void test_lead_unit_lists(void **state) {
  (void)state;
  // Unsplit lead units before finer tails (what the plan takes), lead units
  // of several splits, every unit a lead unit, and one.
  const struct {
    int32_t batch, heads, len, wanted, lead, lead_splits;
  } cases[] = {
      {256, 2, 1024, 3, 396, 1}, {7, 3, 1000, 4, 12, 1}, {5, 2, 4096, 5, 6, 2},
      {4, 2, 700, 3, 8, 1},      {9, 1, 130, 2, 1, 1},
  };
  for (const auto &c : cases) {
    const DecodeWorkList w =
        with_lead(c.batch, c.heads, 64, c.len, c.wanted, c.lead, c.lead_splits);
    assert_int_equal(w.size(),
                     int64_t{c.lead} * w.lead_splits + (w.units() - c.lead) * w.num_splits);
    assert_int_equal(w.slot_splits(), w.num_splits > w.lead_splits ? w.num_splits : w.lead_splits);
    check_list(w, (c.len + 63) / 64);
  }
}

void test_query_tiles(void **state) {
  (void)state;
  // Several query tokens per row in tiles of 16: units are (query tile, row,
  // KV head), the tiles the slowest index; with and without lead units.
  check_list(fd::make_decode_work_list(3, 2, 8, 64, 500, 2, 128, 40, 16), 8);
  check_list(with_lead(3, 2, 64, 500, 3, 5, 1, 40, 16), 8);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_regular_lists),
      cmocka_unit_test(test_lead_unit_lists),
      cmocka_unit_test(test_query_tiles),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
