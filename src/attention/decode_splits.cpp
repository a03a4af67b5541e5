// The CUDA backend's split-KV planning (src/cuda/decode_cuda.cpp plans
// with it): which work list (decode_work.hpp) a decode call runs, from
// host-known values only: the shape, the longest row, num_splits, the
// workspace, and the device's CTA slots (DecodeSlots). Plain C++ with no
// CUDA header, like sm90_choice.hpp, so the CPU unit suite
// tests/unit_decode_splits.cpp checks its choices for the benchmark grid.
#include "attention/decode_splits.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attention/decode_limits.hpp"
#include "attention/sm90_choice.hpp"
#include "attention/swap_choice.hpp"
#include "attention/variant.hpp"
#include "core/arg_checks.hpp"
#include "core/dtype.hpp"

namespace fd {
namespace cuda {
namespace {

constexpr int kTile = kDecodeTileTokens;
// Auto splitting (choose_splits) models waves of resident CTAs and keeps
// every partition at least two tiles long when that still gives a quarter of
// the resident CTA slots, else one tile (few-CTA grids such as batch 1 x 2048
// are latency-bound; H200 bf16 1x2048: A 16 splits of 2 tiles 8.55 us, 32 of
// 1 tile 9.23 us; C and D, with 2 and 4 kv heads, 0.5-0.7 us faster with 1)...
constexpr int kMinSplitTokens = 2 * kTile;
// ...and cuts rows longer than this so ragged batches balance across SMs.
constexpr int kMaxSplitTokens = 4096;
// Batches (more than one row) whose hint exceeds kMaxSplitTokens may be
// ragged (the host knows only the hint): their rows are cut at this length,
// so the longest rows do not run alone at the end (measured on H200, shape A
// ragged bf16 bs16: 2/4/8 splits = 0.91/0.95/0.94 of copy).
constexpr int kRaggedSplitTokens = 2048;
// When such a batch has at least kRaggedMinRows rows and enough of them to
// fill the GPU by itself (rows x kv heads >= a third of the resident CTA
// slots), it is cut into at least kRaggedCtasPerSlot CTAs per slot, in pieces
// of at least kRaggedMinTokens: many short CTAs even out the unknown lengths.
// H200, bf16 bs16, 5d96b63 kernels (us by split count): D ragged 16 splits
// 86.7 (4: 92.3, 8: 87.3, 3: 83.3); A ragged 7 splits 283.1 (4: 281.5, 16:
// 296.1); C ragged does not qualify (128 rows x heads < 396 / 3) and keeps 4
// splits, its best (81.5; 16: 85.2).
constexpr int kRaggedCtasPerSlot = 8;
constexpr int kRaggedMinTokens = 512;
constexpr uint32_t kRaggedMinRows = 16;
// A batch of at least kRaggedMinRows rows that the plan knows to be ragged
// (host lengths: their mean at most kRaggedMeanShare of the longest) is cut
// into at least kRaggedMinWaveQuarters / 4 waves of CTAs, so that CTAs of
// the grid's later part start where short rows finished instead of every
// SM keeping the units it was given at launch. H200, FP8, C ragged (64 rows
// of U[128, 8192]; 128 units on the swapped kernel's 528 slots), us by
// splits: 4 (0.97 waves) 51.4, 6 (1.45) 44.1, 8 (1.94) 50.7; D ragged 4
// (1.29 waves) 50.8. From the hint alone the same rule made uniform 64 x
// 8192 and 16 x 8192 batches 10-21% slower (session 12, call 7), so it
// needs the lengths.
constexpr int kRaggedMinWaveQuarters = 5;
constexpr double kRaggedMeanShare = 2.0 / 3.0;
// Modelled start/drain cost of one CTA and the cost of the merge launch, in
// units of one tile's streaming time (measured on an H200, docs/kernel-design.md).
constexpr double kCtaCostTiles = 1.5;
constexpr double kMergeCostTiles = 2.0;
// Lead units (DecodeWorkList::lead_units) replace the regular list only when
// the wave model gives them at least this much less time.
constexpr double kLeadGain = 0.95;
// The deep CTA shape (DecodeWorkList::deep_stages) for lists of at most its
// CTAs per SM whose items walk at least this many tiles. H200, bf16, C (2
// KV heads, group 8) 1 x 32768, 256 items of 4 tiles: 16.68 -> 15.96 us
// (docs/kernel-design.md). In a trial of the shape for every grid (session
// 9), items of 1-2 tiles (batch 1 x 2048) ran 8-11% slower: a CTA's start is
// not hidden there, and a third resident CTA per SM overlaps it.
constexpr int32_t kDeepMinTiles = 4;

// 16-bit (f16 or bf16) K/V.
bool kv_16bit(const DecodeProblem &pb) {
  return pb.kv.dtype == FD_DTYPE_F16 || pb.kv.dtype == FD_DTYPE_BF16;
}

// FP8 K/V: a tile streams in half the time, so the same fixed costs are
// twice as many tiles.
double cost_scale(const DecodeProblem &pb) {
  return dtype_is_fp8(pb.kv.dtype) ? 2.0 : 1.0;
}

// Whether the deep CTA shape (kernels/decode_config.cuh, Config's kDeep)
// serves a problem: head_dim 128 over 16-bit K/V, token-major, one query
// token per row, no attention variant (a run with one takes the regular
// shape whatever its plan says).
bool deep_shape_serves(const DecodeProblem &pb, bool sm90_device) {
  return pb.head_dim == 128 && kv_16bit(pb) && !pb.kv.dim_major() && pb.max_q_len <= 1 &&
         pb.variant.is_plain() && !takes_sm90(pb, sm90_device);
}

// CTA slots of the deep shape on the device (one wave).
int64_t deep_slots(const DecodeSlots &s) {
  return s.sms * s.deep_ctas_per_sm;
}

// Whether a list runs in the deep shape: one the shape serves, every item of
// at least kDeepMinTiles tiles, whose grid it holds in one wave or, unsplit,
// in two (choose_splits' unsplit lists of 2-4 units per SM). One wave: a
// grid leaves at most 2 CTAs on an SM in either shape (the hardware spreads
// a grid over the SMs before it stacks them: a probe on the H200 put 256
// CTAs as 124 SMs x 2 + 8 x 1), and a CTA keeps one tile fewer than its
// stages in flight while it reads the other: 2 regular CTAs hold 2 tiles
// (64 KB) in flight per SM, 2 deep ones 4. H200, bf16, 256 CTAs of one
// 4096-token (row, KV head) each: 162 us regular, 125 us deep.
// The swapped FP8 kernel's deep shape (the m-tile FP8 kernel's stages and
// CTAs per SM: 4 x 16 KB at 3 per SM for head_dim 128, 6 x 8 KB at 4 for
// 64) instead of its regular one (3 stages at 4 per SM, 4 at 6) for a list
// of items that
// fill exactly one wave of it: more than deep_ctas_per_sm - 1 items per SM,
// at most deep_ctas_per_sm, each of at least kDeepMinTiles tiles. Each SM
// then holds the same CTAs with more tiles in flight each. H200, head_dim
// 64 (D 128 x 2048, 512 units unsplit: 41.7 us deep against 44.1 at 3
// regular splits and 47.6 unsplit regular; D 1 x 32768, 512 TMA items of 4
// tiles: 11.3 against 12.5). Lists of fewer items per SM (D 64 x 4096 as
// 256 units: 57 us either shape, against 40.9 at 3 regular splits) and of
// more (several waves of either shape) keep the regular shape. Split
// counts chosen to fill its wave instead of the automatic ones (A 1 x
// 32768 at 40 / 48, A 8 x 8192 at 5 / 6, C 64 x 4096 at 3, D 64 x 4096 at
// 2, ...) were 0.4-6% slower on every other grid case, so the split rule
// does not aim for it. Token-major K/V only: dim-major lists in it ran 5-13% behind token-major
// ones (A 8 x 8192, 320 / 384 items), against 2% in the regular shape.
bool fills_swap_deep_wave(const DecodeProblem &pb, int64_t items, const DecodeSlots &s) {
  return !pb.kv.dim_major() && s.deep_ctas_per_sm > 0 && items > (s.deep_ctas_per_sm - 1) * s.sms &&
         items <= deep_slots(s);
}

bool takes_deep_stages(const DecodeProblem &pb, const DecodeWorkList &work, const DecodeSlots &s) {
  if (takes_swapped(pb))
    return work.lead_units == 0 && fills_swap_deep_wave(pb, work.size(), s) &&
           work.tiles_per_split >= kDeepMinTiles;
  const bool waves_fit =
      work.size() <= deep_slots(s) || (work.num_splits == 1 && work.size() <= 2 * deep_slots(s));
  return deep_shape_serves(pb, s.sm90_device) && work.lead_units == 0 && waves_fit &&
         work.tiles_per_split >= kDeepMinTiles;
}

// Whether a list stages by TMA (DecodeWorkList::tma_stages): the swapped
// FP8 kernel serves it (takes_swapped) over token-major K/V (a box is one
// block's token rows) on a compute capability 9.0 device,
// the grid fits one wave, and no item walks more than kDecodeTmaMaxTiles
// tiles: there every CTA's first tile is on the critical path, and TMA
// brings it sooner (no per-thread copy addressing). H200, measured at 3
// CTAs per SM (docs/kernel-design.md): such lists (C / D 1 x 2048 and
// 1 x 32768, A / B 1 x 2048) 7-12% faster than cp.async; longer items (6
// tiles or more) 1-11% slower, and a many-wave grid of 4-tile items (A 256
// x 1024) 3% slower.
bool takes_tma_stages(const DecodeProblem &pb, const DecodeWorkList &work, const DecodeSlots &s) {
  return takes_swapped(pb) && !pb.kv.dim_major() && s.sm90_device &&
         work.size() <= s.sms * s.ctas_per_sm && work.tiles_per_split <= kDecodeTmaMaxTiles &&
         (work.lead_units == 0 || work.lead_tiles_per_split <= kDecodeTmaMaxTiles);
}

// The regular work list of `wanted` whole-tile splits.
DecodeWorkList make_list(const DecodeProblem &pb, int max_len, int64_t wanted) {
  const int32_t w = static_cast<int32_t>(std::min<int64_t>(wanted, cuda::kDecodeMaxSplits));
  return make_decode_work_list(static_cast<int32_t>(pb.batch),
                               static_cast<int32_t>(pb.num_kv_heads),
                               static_cast<int32_t>(pb.group_size), kTile, max_len, w,
                               cuda::kDecodeMaxSplits, pb.max_q_len, query_tile_tokens(pb));
}

// Modelled time (in tiles) of `units` units of `tiles` tiles cut into
// `splits` splits each, in waves of `slots` resident CTAs.
double wave_cost(int64_t units, int64_t tiles, int64_t splits, int64_t slots, double fixed) {
  const int64_t per = (tiles + splits - 1) / splits;
  const int64_t waves = (units * splits + slots - 1) / slots;
  return static_cast<double>(waves) * (static_cast<double>(per) + kCtaCostTiles * fixed);
}

// Known-ragged batches over 16-bit K/V (host lengths) choose their split
// count, at most the rules' one, by simulating the list (ragged_list_ticks)
// for at most kRaggedSimSplits counts and kRaggedSimItems items in all
// (23-71 us of host time for 64-512 rows of 4-8 KV heads), with a CTA's
// start and end costing kRaggedStartTicks half tiles (kCtaCostTiles). H200,
// decode_bench's ragged rows (docs/perf/h200-session15-8e1b429-2026-12-03.md):
// D 15 -> 7 splits, 82.4 -> 77.7 us; A 7 -> 4 and B 4 -> 2 within 0.2%.
// The model overrates finer lists (each piece also writes a partial the
// merge reads): uncapped it gave C 10 splits, modelled 11% faster than the
// rules' 4 and measured 1.8% slower, hence the cap. FP8 K/V keep the rules:
// the model gave FP8 D ragged 10 splits (51.96 us where the rule's 4 ran
// 51.57), and session 12's rule was measured best or within 2% for them.
constexpr int64_t kRaggedSimSplits = 16;
constexpr int64_t kRaggedSimItems = 1 << 16;
constexpr int64_t kRaggedStartTicks = static_cast<int64_t>(2 * kCtaCostTiles);

// Modelled time, in half tiles, of the regular list `work` (16-bit K/V)
// over rows of `spans` keys (the plan's host lengths): the hardware hands
// items to `slots` resident CTA slots in index order as slots free; an item
// of n tiles holds its slot for n tiles plus kRaggedStartTicks, an empty
// one for half a tile; a split list adds the merge (kMergeCostTiles). Unlike wave_cost it sees
// which rows are short, so it tells a count whose last items are short remainders that fill in
// behind the others (one wave and a little) from one that leaves a second wave of whole splits.
int64_t ragged_list_ticks(const DecodeWorkList &work, const int32_t *spans, int64_t slots,
                          std::vector<int32_t> &release) {
  release.assign(static_cast<size_t>(64), 0);
  int64_t t = 0, avail = std::max<int64_t>(slots, 1), end = 0;
  for (int32_t r = 0; r < work.batch; ++r) {
    const int64_t row_tiles = (static_cast<int64_t>(spans[r]) + kTile - 1) / kTile;
    for (int32_t h = 0; h < work.num_kv_heads; ++h)
      for (int32_t s = 0; s < work.num_splits; ++s) {
        const int64_t left = row_tiles - static_cast<int64_t>(s) * work.tiles_per_split;
        const int64_t n =
            s + 1 == work.num_splits ? left : std::min<int64_t>(left, work.tiles_per_split);
        const int64_t d = n > 0 ? 2 * n + kRaggedStartTicks : 1;
        while (avail == 0) {
          ++t;
          avail += release[static_cast<size_t>(t)];
          release[static_cast<size_t>(t)] = 0;
        }
        --avail;
        const int64_t free_at = t + d;
        if (free_at >= static_cast<int64_t>(release.size()))
          release.resize(static_cast<size_t>(2 * free_at + 1), 0);
        ++release[static_cast<size_t>(free_at)];
        end = std::max(end, free_at);
      }
  }
  const int64_t merge = work.num_splits > 1 ? static_cast<int64_t>(2 * kMergeCostTiles) : 0;
  return end + merge;
}

// The split count of least modelled time (ragged_list_ticks) for a batch of
// `spans` keys per row, from 1 to `limit` splits (at most kRaggedSimSplits,
// kRaggedSimItems items simulated in all); a count must beat the best fewer
// one by 2%.
int64_t simulated_ragged_splits(const DecodeProblem &pb, int max_len, const int32_t *spans,
                                int64_t slots, int64_t limit) {
  const int64_t units = static_cast<int64_t>(pb.batch) * pb.num_kv_heads;
  std::vector<int32_t> release;
  int64_t best_splits = 1, simulated = 0;
  double best = 0;
  for (int64_t s = 1; s <= std::min(limit, kRaggedSimSplits); ++s) {
    simulated += units * s;
    if (s > 1 && simulated > kRaggedSimItems) break;
    const DecodeWorkList w = make_list(pb, max_len, s);
    if (s > 1 && w.num_splits < s) continue;  // (the same list as a smaller count)
    const double cost = static_cast<double>(ragged_list_ticks(w, spans, slots, release));
    if (s == 1 || cost < best * 0.98) best = cost, best_splits = s;
  }
  return best_splits;
}

// Lead units (decode_work.hpp): when the units overfill the resident slots
// and the last wave of a regular list would run part-empty (few CTAs per SM
// stream far below the SM's share of bandwidth: H200 C 256 x 1024 took the
// same time with 1-4 regular splits), whole waves of units run unsplit and
// the rest are cut into `tail` splits that fill one more wave. Returns
// `regular` unless the wave model gives the lead list kLeadGain of its time
// or less. Lead units of several splits (every unit then merged) lost to
// the regular list on the H200 (A 128 x 2048: 292 vs 254 us) or tied (B 32
// x 4096), so they are not considered. The choice reads nothing but its
// arguments (no environment switch): tests reach lead lists through shapes
// that take them (tests/gpu_decode.cpp) and their layout through
// tests/unit_decode_work.cpp.
DecodeWorkList with_lead_units(const DecodeProblem &pb, int max_len, const DecodeWorkList &regular,
                               int64_t units, int64_t slots, int64_t limit) {
  const int64_t tiles = (max_len + kTile - 1) / kTile;
  const double fixed = cost_scale(pb);
  const double merge = kMergeCostTiles * fixed;
  const double reg_cost = wave_cost(units, tiles, regular.num_splits, slots, fixed) +
                          (regular.num_splits > 1 ? merge : 0.0);
  const int64_t lead_units = units / slots * slots;  // whole waves
  const int64_t rest = units - lead_units;
  double best = 0;
  int64_t best_tail = 0;
  for (int64_t tail = 2; rest > 0 && tail <= limit && rest * tail <= slots; ++tail) {
    const double cost = wave_cost(lead_units, tiles, 1, slots, fixed) +
                        wave_cost(rest, tiles, tail, slots, fixed) + merge;
    if (best_tail == 0 || cost < best) best = cost, best_tail = tail;
  }
  if (lead_units < 1 || best_tail == 0 || best > kLeadGain * reg_cost) return regular;
  const DecodeWorkList tail = make_list(pb, max_len, best_tail);
  if (tail.num_splits < 2) return regular;
  return lead_list(tail, make_list(pb, max_len, 1), static_cast<int32_t>(lead_units));
}

}  // namespace

// Query tokens of one query tile: every query row of a (row, KV head) in one
// CTA when max_q_len x group fits its kDecodeMaxQueryRows rows (speculative
// verification: one K/V read for all of them), else tiles of whole tokens of
// at most that many rows (prefill chunks: one CTA per tile, each walking only
// the keys its last token sees). group <= kDecodeMaxGroup = 32, so a tile
// holds at least 2 tokens.
int32_t query_tile_tokens(const DecodeProblem &pb) {
  const int64_t rows = static_cast<int64_t>(pb.max_q_len) * pb.group_size;
  if (rows <= cuda::kDecodeMaxQueryRows || pb.group_size < 1) return pb.max_q_len;
  return static_cast<int32_t>(cuda::kDecodeMaxQueryRows / pb.group_size);
}
int64_t query_tiles(const DecodeProblem &pb) {
  const int32_t t = query_tile_tokens(pb);
  return (static_cast<int64_t>(pb.max_q_len) + t - 1) / t;
}

// Whether a call of this problem runs the Hopper kernel
// (kernels/decode_sm90.cu) on a device that is (`sm90_device`) or is not of
// compute capability 9.0.
bool takes_sm90(const DecodeProblem &pb, bool sm90_device) {
  return sm90_device &&
         cuda::sm90_serves(pb.q_dtype, pb.kv.dtype, pb.kv.dim_major(),
                           static_cast<int32_t>(pb.head_dim), pb.max_q_len,
                           static_cast<int64_t>(query_tile_tokens(pb)) * pb.group_size,
                           pb.variant.is_plain());
}

bool takes_swapped(const DecodeProblem &pb) {
  return swapped_serves(pb.kv.dtype, pb.max_q_len, pb.group_size, pb.variant.is_plain());
}

size_t decode_workspace_bytes(const DecodeProblem &pb, const DecodeWorkList &work) {
  if (!work.has_partials()) return 0;
  return static_cast<size_t>(work.partial_slots()) * (pb.head_dim + 2) * sizeof(float);
}

namespace {

// The split choice reads only host-known values: the shape, the longest row
// (exact lengths when planned with them, else the caller's hint),
// num_splits, the workspace size and the SM count.
DecodeWorkList choose_splits(const DecodeProblem &pb, int max_len, bool limit_by_workspace,
                             const DecodeSlots &dev, int64_t total_len, const int32_t *spans) {
  if (max_len < 1) max_len = 1;
  const int tiles_total = (max_len + kTile - 1) / kTile;
  if (pb.num_splits == 1) return make_list(pb, max_len, 1);
  if (pb.num_splits > 1) return make_list(pb, max_len, pb.num_splits);
  // Pick the count with the least modelled time: CTAs run in waves of
  // `slots` resident CTAs, each wave lasts its CTAs' tiles plus a fixed
  // start/drain cost; splitting adds that cost per CTA and a merge. A count
  // that leaves a nearly empty last wave loses to one that fills it.
  const int64_t q_tiles = query_tiles(pb);
  const int64_t ctas = static_cast<int64_t>(pb.batch) * pb.num_kv_heads * q_tiles;
  const int64_t slots = dev.sms * dev.ctas_per_sm;
  // Query tiles that fill the GPU by themselves are not split: the work is
  // compute-bound, every tile sees a different number of keys, and partials
  // of every query row would cost workspace and a merge pass.
  if (q_tiles > 1 && ctas >= slots) return make_list(pb, max_len, 1);
  int min_split = kMinSplitTokens;
  if (ctas * ((max_len + min_split - 1) / min_split) * 4 < slots) min_split = kTile;
  int64_t limit = (max_len + min_split - 1) / min_split;
  if (limit > cuda::kDecodeMaxSplits) limit = cuda::kDecodeMaxSplits;
  int64_t wanted = 1;
  double best = 0;
  const double fixed = cost_scale(pb);
  for (int64_t s = 1; s <= limit; ++s) {
    const int64_t per_cta = (tiles_total + s - 1) / s;
    const int64_t waves = (ctas * s + slots - 1) / slots;
    const double cost =
        static_cast<double>(waves) * (static_cast<double>(per_cta) + kCtaCostTiles * fixed) +
        (s > 1 ? kMergeCostTiles * fixed : 0.0);
    if (s == 1 || cost < best * 0.98) best = cost, wanted = s;
  }
  const int64_t by_max_len = (max_len + kMaxSplitTokens - 1) / kMaxSplitTokens;
  if (wanted < by_max_len) wanted = by_max_len;
  const bool maybe_ragged = pb.batch > 1 && max_len > kMaxSplitTokens;
  if (maybe_ragged) {
    int64_t ragged = (max_len + kRaggedSplitTokens - 1) / kRaggedSplitTokens;
    if (pb.batch >= kRaggedMinRows && ctas * 3 >= slots) {
      const int64_t by_slots = (kRaggedCtasPerSlot * slots + ctas - 1) / ctas;
      const int64_t cap = max_len / kRaggedMinTokens;
      ragged = std::max(ragged, std::min(by_slots, cap));
    }
    const bool known_ragged = total_len > 0 && pb.batch >= kRaggedMinRows &&
                              static_cast<double>(total_len) <=
                                  kRaggedMeanShare * max_len * static_cast<double>(pb.batch);
    if (known_ragged) {
      const int64_t by_waves = (kRaggedMinWaveQuarters * slots + 4 * ctas - 1) / (4 * ctas);
      ragged = std::max(ragged, std::min(by_waves, limit));
    }
    if (wanted < ragged) wanted = ragged;
    // With the rows' spans, 16-bit lists may take fewer splits than the
    // rules give, as the simulation of the exact list says.
    if (known_ragged && spans != nullptr && q_tiles == 1 && kv_16bit(pb))
      wanted = simulated_ragged_splits(pb, max_len, spans, slots, std::min(wanted, limit));
  }
  // Rows of at most kMaxSplitTokens whose units number between one and four
  // per SM run unsplit in the deep shape (one or two waves, no lead units):
  // every SM streams about two whole units at a time, with no merge (H200,
  // bf16, 256 units: C 128 x 2048 69.8 -> 67.0 us against 3 regular splits,
  // A 32 x 4096 125.5 -> 125.1; 512 units: C 256 x 1024 69.2 -> 68.8 (bs16)
  // and 69.0 -> 67.7 (bs32) against a lead list, A 64 x 4096 within 0.3%;
  // B 8 x 8192, of 8192-token rows, was 3% slower so).
  // The swapped FP8 kernel's deep shape takes such rows unsplit when their
  // units fill exactly one wave of it (fills_swap_deep_wave).
  const bool fits_deep = takes_swapped(pb) ? fills_swap_deep_wave(pb, ctas, dev)
                                           : deep_shape_serves(pb, dev.sm90_device) &&
                                                 ctas > dev.sms && ctas <= 2 * deep_slots(dev);
  const bool deep_unsplit = fits_deep && max_len <= kMaxSplitTokens && tiles_total >= kDeepMinTiles;
  if (deep_unsplit) wanted = 1;
  DecodeWorkList work = make_list(pb, max_len, wanted);
  // Lead units for uniform-looking batches of one query token per row (rows
  // that may be ragged keep the regular cuts above; several query tokens per
  // row were neither measured nor tested with lead units).
  if (!maybe_ragged && pb.max_q_len <= 1 && ctas > slots && !deep_unsplit)
    work = with_lead_units(pb, max_len, work, ctas, slots, limit);
  if (limit_by_workspace && work.has_partials()) {
    // Fewer partitions when the caller's workspace cannot hold them all.
    const size_t per_split = decode_workspace_bytes(pb, make_list(pb, 2 * kTile, 2)) / 2;
    size_t fit = pb.workspace == nullptr ? 0 : pb.workspace_size / per_split;
    if (pb.workspace != nullptr && !is_aligned(pb.workspace, 16)) fit = 0;
    if (fit < static_cast<size_t>(work.slot_splits()))
      work = make_list(pb, max_len, fit < 2 ? 1 : static_cast<int64_t>(fit));
  }
  return work;
}

}  // namespace

DecodeWorkList plan_decode_splits(const DecodeProblem &pb, int32_t max_len, bool limit_by_workspace,
                                  const DecodeSlots &slots, int64_t total_len,
                                  const int32_t *spans) {
  DecodeWorkList work = choose_splits(pb, max_len, limit_by_workspace, slots, total_len, spans);
  work.sm90_device = slots.sm90_device;
  work.deep_stages = takes_deep_stages(pb, work, slots);
  work.tma_stages = takes_tma_stages(pb, work, slots);
  return work;
}

}  // namespace cuda
}  // namespace fd
