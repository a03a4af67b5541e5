// CUDA backend of decode attention (backend/backend.hpp): checks what only
// this backend limits (dtypes, head_dim, block size, group size, alignment),
// plans the split-KV work list from host-known values, and enqueues the
// kernels of a work list on the caller's stream. Running does no host
// synchronisation, device allocation or device read, except on the
// FD_DECODE_CHECK_INDICES path, which copies the indices to the host on
// purpose.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention/decode_cpu_indices.hpp"
#include "attention/decode_problem.hpp"
#include "attention/decode_work.hpp"
#include "backend/backend.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "cuda/cuda_util.hpp"
#include "decode_launch.hpp"

namespace fd {
namespace {

constexpr int kTile = cuda::kDecodeTileTokens;
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
// FP8 K/V: a tile streams in half the time, so the same fixed costs are
// twice as many tiles.
double cost_scale(const DecodeProblem &pb) {
  return pb.kv.dtype == FD_DTYPE_FP8_E4M3 ? 2.0 : 1.0;
}

int log2_exact(uint32_t v) {
  int n = 0;
  while ((1u << n) < v) ++n;
  return n;
}

bool aligned16(const void *p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

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

// What this backend serves; everything else is FD_ERR_UNSUPPORTED naming the
// parameter.
void check_supported(const DecodeProblem &pb) {
  // The variants of S2.3 (soft-cap, sliding window, sinks) are served with
  // every type, head_dim and layout below: nothing to refuse here.
  // Served element types: q = out = K/V in f16 or bf16, and q = out in f16
  // or bf16 over FP8 E4M3 K/V.
  const bool fp8 = pb.kv.dtype == FD_DTYPE_FP8_E4M3;
  if (pb.kv.dtype != FD_DTYPE_F16 && pb.kv.dtype != FD_DTYPE_BF16 && !fp8)
    fail(FD_ERR_UNSUPPORTED,
         "kv_dtype %s is not supported on CUDA (supported: f16, bf16, fp8_e4m3)",
         dtype_name(pb.kv.dtype));
  if (fp8 && pb.q_dtype != FD_DTYPE_F16 && pb.q_dtype != FD_DTYPE_BF16)
    fail(FD_ERR_UNSUPPORTED,
         "q_dtype %s is not supported with kv_dtype fp8_e4m3 on CUDA (supported: f16, bf16)",
         dtype_name(pb.q_dtype));
  if (!fp8 && pb.q_dtype != pb.kv.dtype)
    fail(FD_ERR_UNSUPPORTED,
         "q_dtype %s is not supported with kv_dtype %s on CUDA (q_dtype must be %s)",
         dtype_name(pb.q_dtype), dtype_name(pb.kv.dtype), dtype_name(pb.kv.dtype));
  if (pb.out_dtype != pb.q_dtype)
    fail(FD_ERR_UNSUPPORTED,
         "out_dtype %s is not supported with q_dtype %s on CUDA (out_dtype must be %s)",
         dtype_name(pb.out_dtype), dtype_name(pb.q_dtype), dtype_name(pb.q_dtype));
  if (pb.head_dim != 64 && pb.head_dim != 96 && pb.head_dim != 128 && pb.head_dim != 256)
    fail(FD_ERR_UNSUPPORTED, "head_dim %u is not supported on CUDA (supported: 64, 96, 128, 256)",
         pb.head_dim);
  if (fp8 && pb.head_dim != 64 && pb.head_dim != 128)
    fail(FD_ERR_UNSUPPORTED,
         "head_dim %u is not supported with kv_dtype fp8_e4m3 on CUDA (supported: 64, 128)",
         pb.head_dim);
  if (pb.kv.block_size != 8 && pb.kv.block_size != 16 && pb.kv.block_size != 32)
    fail(FD_ERR_UNSUPPORTED, "block_size %u is not supported on CUDA (supported: 8, 16, 32)",
         pb.kv.block_size);
  if (pb.group_size < 1 || pb.group_size > static_cast<uint32_t>(cuda::kDecodeMaxGroup))
    fail(FD_ERR_UNSUPPORTED,
         "GQA group size %u (num_q_heads / num_kv_heads) is not supported on CUDA "
         "(supported: 1..%d)",
         pb.group_size, cuda::kDecodeMaxGroup);
  // The kernel copies 16 bytes (8 16-bit or 16 FP8 elements) at a time along
  // the contiguous axis, so each copy must start 16-byte aligned (FP8
  // dim-major tiles of 8-token blocks copy 8 bytes per dim).
  if (!aligned16(pb.k) || !aligned16(pb.v))
    fail(FD_ERR_UNSUPPORTED, "k_cache and v_cache must be 16-byte aligned on CUDA");
  // q is read as pairs of elements (4 bytes).
  if (reinterpret_cast<uintptr_t>(pb.q) % 4 != 0)
    fail(FD_ERR_UNSUPPORTED, "q must be 4-byte aligned on CUDA");
  const PagedKv &kv = pb.kv;
  const bool dim_major = kv.dim_major();
  const struct {
    const char *name;
    int64_t value;
  } strides[3] = {
      {"stride_block", kv.stride_block},
      {"stride_head", kv.stride_head},
      {dim_major ? "stride_dim" : "stride_token", dim_major ? kv.stride_dim : kv.stride_token}};
  const int64_t elem = static_cast<int64_t>(dtype_size(kv.dtype));
  for (int i = 0; i < 3; ++i) {
    const bool row_of_8 = fp8 && dim_major && kv.block_size == 8 && i == 2;
    const int64_t bytes = row_of_8 ? 8 : 16;  // the copy's alignment
    if (strides[i].value * elem % bytes != 0)
      fail(FD_ERR_UNSUPPORTED,
           "%s %lld is not supported on CUDA: it must be a multiple of %lld elements (%lld bytes)",
           strides[i].name, static_cast<long long>(strides[i].value),
           static_cast<long long>(bytes / elem), static_cast<long long>(bytes));
  }
  if ((dim_major ? kv.stride_token : kv.stride_dim) != 1)
    fail(FD_ERR_UNSUPPORTED, "%s must be 1 for this layout on CUDA",
         dim_major ? "stride_token" : "stride_dim");
  const uint64_t grid_rows = static_cast<uint64_t>(pb.batch) * pb.num_kv_heads;
  if (grid_rows * cuda::kDecodeMaxSplits > 0x7fffffffull || kv.num_blocks > 0x7fffffffu ||
      static_cast<uint64_t>(pb.max_blocks_per_seq) * kv.block_size > 0x7fffffffull)
    fail(FD_ERR_UNSUPPORTED, "batch %u x num_kv_heads %u is too large for one CUDA launch",
         pb.batch, pb.num_kv_heads);
  // Several query tokens per row: one CTA per query tile (and split), one
  // merge warp group per (row, query token, q head); both index spaces must
  // fit one CUDA grid in 32-bit arithmetic.
  const uint64_t q_tiles = static_cast<uint64_t>(query_tiles(pb));
  if (grid_rows * q_tiles * cuda::kDecodeMaxSplits > 0x7fffffffull ||
      static_cast<uint64_t>(pb.batch) * static_cast<uint64_t>(pb.max_q_len) * pb.num_q_heads >
          0x7fffffffull)
    fail(FD_ERR_UNSUPPORTED,
         "batch %u x max_q_len_hint %d x num_q_heads %u query rows are too many for one CUDA "
         "launch",
         pb.batch, static_cast<int>(pb.max_q_len), pb.num_q_heads);
}

int multiprocessor_count(int32_t ordinal) {
  int sms = 0;
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal),
             "cudaDeviceGetAttribute(multiProcessorCount)");
  return sms > 0 ? sms : 1;
}

// Compute capability 9.0 exactly: the sm_90a kernels (kernels/decode_sm90.cu)
// run on no other device.
bool is_sm90(int32_t ordinal) {
  int major = 0, minor = 0;
  cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal),
             "cudaDeviceGetAttribute(computeCapabilityMajor)");
  cuda_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal),
             "cudaDeviceGetAttribute(computeCapabilityMinor)");
  return major == 9 && minor == 0;
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

// Whether the deep CTA shape (kernels/decode_config.cuh, Config's kDeep)
// serves a problem: head_dim 128 over 16-bit K/V, token-major, one query
// token per row, no attention variant (a run with one takes the regular
// shape whatever its plan says).
bool deep_shape_serves(const DecodeProblem &pb, bool sm90_device) {
  const bool kv16 = pb.kv.dtype == FD_DTYPE_F16 || pb.kv.dtype == FD_DTYPE_BF16;
  return pb.head_dim == 128 && kv16 && !pb.kv.dim_major() && pb.max_q_len <= 1 &&
         pb.variant.is_plain() && !takes_sm90(pb, sm90_device);
}

// CTA slots of the deep shape on the problem's device (one wave).
int64_t deep_slots(const DecodeProblem &pb) {
  return static_cast<int64_t>(multiprocessor_count(pb.device_ordinal)) *
         cuda::decode_deep_ctas_per_sm();
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
bool takes_deep_stages(const DecodeProblem &pb, const DecodeWorkList &work, bool sm90_device) {
  const bool waves_fit =
      work.size() <= deep_slots(pb) || (work.num_splits == 1 && work.size() <= 2 * deep_slots(pb));
  return deep_shape_serves(pb, sm90_device) && work.lead_units == 0 && waves_fit &&
         work.tiles_per_split >= kDeepMinTiles;
}

size_t workspace_bytes(const DecodeProblem &pb, const DecodeWorkList &work) {
  if (!work.has_partials()) return 0;
  return static_cast<size_t>(work.partial_slots()) * (pb.head_dim + 2) * sizeof(float);
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

// The split choice reads only host-known values: the shape, the longest row
// (exact lengths when planned with them, else the caller's hint),
// num_splits, the workspace size and the SM count.
DecodeWorkList choose_splits(const DecodeProblem &pb, int max_len, bool limit_by_workspace,
                             bool sm90_device) {
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
  const int64_t slots =
      static_cast<int64_t>(multiprocessor_count(pb.device_ordinal)) *
      cuda::decode_ctas_per_sm(static_cast<int32_t>(pb.head_dim), takes_sm90(pb, sm90_device));
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
    if (wanted < ragged) wanted = ragged;
  }
  // Rows of at most kMaxSplitTokens whose units number between one and four
  // per SM run unsplit in the deep shape (one or two waves, no lead units):
  // every SM streams about two whole units at a time, with no merge (H200,
  // bf16, 256 units: C 128 x 2048 69.8 -> 67.0 us against 3 regular splits,
  // A 32 x 4096 125.5 -> 125.1; 512 units: C 256 x 1024 69.2 -> 68.8 (bs16)
  // and 69.0 -> 67.7 (bs32) against a lead list, A 64 x 4096 within 0.3%;
  // B 8 x 8192, of 8192-token rows, was 3% slower so).
  const int64_t sms = multiprocessor_count(pb.device_ordinal);
  const bool deep_unsplit = deep_shape_serves(pb, sm90_device) && max_len <= kMaxSplitTokens &&
                            tiles_total >= kDeepMinTiles && ctas > sms &&
                            ctas <= 2 * deep_slots(pb);
  if (deep_unsplit) wanted = 1;
  DecodeWorkList work = make_list(pb, max_len, wanted);
  // Lead units for uniform-looking batches of one query token per row (rows
  // that may be ragged keep the regular cuts above; several query tokens per
  // row were neither measured nor tested with lead units).
  if (!maybe_ragged && pb.max_q_len <= 1 && ctas > slots && !deep_unsplit)
    work = with_lead_units(pb, max_len, work, ctas, slots, limit);
  if (limit_by_workspace && work.has_partials()) {
    // Fewer partitions when the caller's workspace cannot hold them all.
    const size_t per_split = workspace_bytes(pb, make_list(pb, 2 * kTile, 2)) / 2;
    size_t fit = pb.workspace == nullptr ? 0 : pb.workspace_size / per_split;
    if (pb.workspace != nullptr && !aligned16(pb.workspace)) fit = 0;
    if (fit < static_cast<size_t>(work.slot_splits()))
      work = make_list(pb, max_len, fit < 2 ? 1 : static_cast<int64_t>(fit));
  }
  return work;
}

// FD_DECODE_CHECK_INDICES: the one synchronising path. Copies seq_lens and
// block tables to the host and checks them before anything is launched.
void check_indices_on_host(const DecodeProblem &pb, cudaStream_t stream) {
  std::vector<int32_t> lens(pb.batch);
  std::vector<int32_t> tables(static_cast<size_t>(pb.batch) * pb.max_blocks_per_seq);
  std::vector<int32_t> indptr(pb.q_indptr != nullptr ? pb.batch + 1 : 0);
  std::vector<float> sinks(pb.variant.sinks != nullptr ? pb.num_q_heads : 0);
  if (pb.variant.sinks != nullptr)
    cuda_check(cudaMemcpyAsync(sinks.data(), pb.variant.sinks, sinks.size() * sizeof(float),
                               cudaMemcpyDefault, stream),
               "copying sinks to the host");
  if (pb.q_indptr != nullptr)
    cuda_check(cudaMemcpyAsync(indptr.data(), pb.q_indptr, indptr.size() * sizeof(int32_t),
                               cudaMemcpyDefault, stream),
               "copying q_indptr to the host");
  cuda_check(cudaMemcpyAsync(lens.data(), pb.seq_lens, lens.size() * sizeof(int32_t),
                             cudaMemcpyDefault, stream),
             "copying seq_lens to the host");
  cuda_check(cudaMemcpyAsync(tables.data(), pb.block_tables, tables.size() * sizeof(int32_t),
                             cudaMemcpyDefault, stream),
             "copying block_tables to the host");
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  // The same checks as the CPU backend's, including seq_len <= the resolved
  // max_seq_len_hint: a row longer than the hint would otherwise run with
  // the hint's split layout at reduced speed, and the hint is the caller's
  // promise.
  // (The sinks are device memory: the check reads the host copy.)
  DecodeProblem host = pb;
  if (pb.variant.sinks != nullptr) host.variant.sinks = sinks.data();
  check_decode_indices(host, lens.data(), tables.data(),
                       pb.q_indptr != nullptr ? indptr.data() : nullptr);
}

}  // namespace

namespace backend {

DecodeWorkList cuda_plan_decode(const DecodeProblem &problem, const int32_t *host_seq_lens,
                                bool limit_by_workspace) {
  require_cuda_device(problem.device_ordinal);
  check_supported(problem);
  // Once per plan, not per run: the kernel's shared memory limit is a
  // per-device setting, and runs on this plan use the same device, element
  // types, head_dim and layout (attention/decode_plan.cpp checks it).
  const bool sm90 = is_sm90(problem.device_ordinal);
  {
    CudaDeviceScope scope(problem.device_ordinal);
    cuda::DecodeLaunch kernel;
    kernel.q_dtype = problem.q_dtype;
    kernel.kv_dtype = problem.kv.dtype;
    kernel.head_dim = static_cast<int32_t>(problem.head_dim);
    kernel.dim_major = problem.kv.dim_major();
    kernel.work.max_q_len = problem.max_q_len;
    kernel.work.sm90_device = sm90;
    cuda_check(cuda::prepare_decode(kernel), "preparing the CUDA decode kernel");
  }
  // The split layout counts only the keys a row's queries can see: with a
  // sliding window, the span from the tile holding the first visible
  // position (decode_work.hpp, planned_span), the whole row otherwise.
  const VariantPolicy policy = VariantPolicy::of(problem.variant);
  const int32_t q_tile = query_tile_tokens(problem);
  auto span = [&](int32_t len) {
    return planned_span(policy, len, problem.max_q_len, q_tile, kTile);
  };
  int max_len = span(problem.max_seq_len);
  if (host_seq_lens != nullptr) {
    max_len = 0;
    for (uint32_t r = 0; r < problem.batch; ++r)
      max_len = std::max(max_len, span(host_seq_lens[r]));
  }
  DecodeWorkList work = choose_splits(problem, max_len, limit_by_workspace, sm90);
  work.sm90_device = sm90;
  work.deep_stages = takes_deep_stages(problem, work, sm90);
  return work;
}

size_t cuda_decode_workspace_bytes(const DecodeProblem &problem, const DecodeWorkList &work) {
  return workspace_bytes(problem, work);
}

void cuda_run_decode(const DecodeProblem &problem, const DecodeWorkList &work) {
  // A run may change everything but the planned shape: check it again
  // (cheap, host values only).
  check_supported(problem);
  CudaDeviceScope scope(problem.device_ordinal);
  cudaStream_t stream = reinterpret_cast<cudaStream_t>(problem.stream);
  if (problem.flags & FD_DECODE_CHECK_INDICES) check_indices_on_host(problem, stream);

  const PagedKv &kv = problem.kv;
  cuda::DecodeLaunch l;
  l.q_dtype = problem.q_dtype;
  l.kv_dtype = kv.dtype;
  l.dim_major = kv.dim_major();
  l.head_dim = static_cast<int32_t>(problem.head_dim);
  l.q = problem.q;
  l.k = problem.k;
  l.v = problem.v;
  l.out = problem.out;
  l.block_tables = problem.block_tables;
  l.seq_lens = problem.seq_lens;
  l.q_indptr = problem.q_indptr;
  l.stride_block = kv.stride_block;
  l.stride_head = kv.stride_head;
  l.stride_token = kv.stride_token;
  l.stride_dim = kv.stride_dim;
  l.block_size_log2 = log2_exact(kv.block_size);
  l.num_blocks = static_cast<int32_t>(kv.num_blocks);
  l.max_blocks_per_seq = static_cast<int32_t>(problem.max_blocks_per_seq);
  l.variant = problem.variant;
  l.k_scale = problem.k_scale;
  l.v_scale = problem.v_scale;
  l.work = work;
  if (work.has_partials()) {
    l.partial_o = static_cast<float *>(problem.workspace);
    l.partial_ml = l.partial_o + static_cast<size_t>(work.partial_slots()) * problem.head_dim;
  }
  l.stream = stream;
  cuda_check(cuda::launch_decode(l), "launching the CUDA decode kernel");
}

}  // namespace backend
}  // namespace fd
