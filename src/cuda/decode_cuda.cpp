// CUDA backend of fd_decode: checks what only this backend limits (dtype,
// head_dim, block size, group size, alignment), chooses the split-KV count
// from host-known values, and enqueues the kernels on the caller's stream.
// No host synchronisation, device allocation or device read happens here,
// except on the FD_DECODE_CHECK_INDICES path, which copies the indices to
// the host on purpose.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/device.hpp"
#include "core/error.hpp"
#include "decode_launch.hpp"
#include "ops/decode_cpu_indices.hpp"
#include "ops/decode_problem.hpp"

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

void check_cuda(cudaError_t err, const char *what) {
  if (err != cudaSuccess)
    fail(FD_ERR_DEVICE, "%s failed: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

int log2_exact(uint32_t v) {
  int n = 0;
  while ((1u << n) < v) ++n;
  return n;
}

bool aligned16(const void *p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// What this backend serves; everything else is FD_ERR_UNSUPPORTED naming the
// parameter.
void check_supported(const DecodeProblem &pb) {
  if (pb.dtype == FD_DTYPE_F32)
    fail(FD_ERR_UNSUPPORTED, "dtype f32 is not supported on CUDA (use f16 or bf16)");
  if (pb.dtype != FD_DTYPE_F16 && pb.dtype != FD_DTYPE_BF16)
    fail(FD_ERR_UNSUPPORTED, "dtype %d is not supported on CUDA", pb.dtype);
  if (pb.head_dim != 64 && pb.head_dim != 128)
    fail(FD_ERR_UNSUPPORTED, "head_dim %u is not supported on CUDA (supported: 64, 128)",
         pb.head_dim);
  if (pb.block_size != 8 && pb.block_size != 16 && pb.block_size != 32)
    fail(FD_ERR_UNSUPPORTED, "block_size %u is not supported on CUDA (supported: 8, 16, 32)",
         pb.block_size);
  if (pb.group_size < 1 || pb.group_size > static_cast<uint32_t>(cuda::kDecodeMaxGroup))
    fail(FD_ERR_UNSUPPORTED,
         "GQA group size %u (num_q_heads / num_kv_heads) is not supported on CUDA "
         "(supported: 1..%d)",
         pb.group_size, cuda::kDecodeMaxGroup);
  if (pb.layout != FD_LAYOUT_TOKEN_MAJOR && pb.layout != FD_LAYOUT_DIM_MAJOR)
    fail(FD_ERR_UNSUPPORTED, "layout %d is not supported on CUDA", pb.layout);
  // The kernel copies 16 bytes (8 elements) at a time along the contiguous
  // axis, so each copy must start 16-byte aligned.
  if (!aligned16(pb.k) || !aligned16(pb.v))
    fail(FD_ERR_UNSUPPORTED, "k_cache and v_cache must be 16-byte aligned on CUDA");
  // q is read as pairs of elements (4 bytes).
  if (reinterpret_cast<uintptr_t>(pb.q) % 4 != 0)
    fail(FD_ERR_UNSUPPORTED, "q must be 4-byte aligned on CUDA");
  const bool dim_major = pb.layout == FD_LAYOUT_DIM_MAJOR;
  const struct {
    const char *name;
    int64_t value;
  } strides[3] = {
      {"stride_block", pb.stride_block},
      {"stride_head", pb.stride_head},
      {dim_major ? "stride_dim" : "stride_token", dim_major ? pb.stride_dim : pb.stride_token}};
  for (const auto &s : strides)
    if (s.value % 8 != 0)
      fail(FD_ERR_UNSUPPORTED,
           "%s %lld is not supported on CUDA: it must be a multiple of 8 elements (16 bytes)",
           s.name, static_cast<long long>(s.value));
  if ((dim_major ? pb.stride_token : pb.stride_dim) != 1)
    fail(FD_ERR_UNSUPPORTED, "%s must be 1 for this layout on CUDA",
         dim_major ? "stride_token" : "stride_dim");
  const uint64_t grid_rows = static_cast<uint64_t>(pb.batch) * pb.num_kv_heads;
  if (grid_rows * cuda::kDecodeMaxSplits > 0x7fffffffull || pb.num_blocks > 0x7fffffffu ||
      static_cast<uint64_t>(pb.max_blocks_per_seq) * pb.block_size > 0x7fffffffull)
    fail(FD_ERR_UNSUPPORTED, "batch %u x num_kv_heads %u is too large for one CUDA launch",
         pb.batch, pb.num_kv_heads);
}

int multiprocessor_count(int32_t ordinal) {
  int sms = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal),
             "cudaDeviceGetAttribute(multiProcessorCount)");
  return sms > 0 ? sms : 1;
}

struct SplitPlan {
  int splits = 1;
  int tiles_per_split = 0;
};

size_t workspace_bytes(const DecodeProblem &pb, int splits) {
  if (splits <= 1) return 0;
  const size_t slots = static_cast<size_t>(pb.batch) * pb.num_q_heads * splits;
  return slots * (pb.head_dim + 2) * sizeof(float);
}

// Turns a wanted partition count into whole-tile partitions.
SplitPlan make_plan(int tiles_total, int wanted) {
  SplitPlan plan;
  if (wanted > cuda::kDecodeMaxSplits) wanted = cuda::kDecodeMaxSplits;
  if (wanted > tiles_total) wanted = tiles_total;
  if (wanted < 1) wanted = 1;
  plan.tiles_per_split = (tiles_total + wanted - 1) / wanted;
  plan.splits = (tiles_total + plan.tiles_per_split - 1) / plan.tiles_per_split;
  return plan;
}

// The split choice reads only host-known values: the shape, max_seq_len (the
// caller's hint), num_splits, the workspace size and the SM count.
SplitPlan choose_splits(const DecodeProblem &pb, bool limit_by_workspace) {
  const int max_len = pb.max_seq_len > 0 ? pb.max_seq_len : 1;
  const int tiles_total = (max_len + kTile - 1) / kTile;
  if (pb.num_splits == 1) return make_plan(tiles_total, 1);
  if (pb.num_splits > 1) return make_plan(tiles_total, pb.num_splits);
  // Pick the count with the least modelled time: CTAs run in waves of
  // `slots` resident CTAs, each wave lasts its CTAs' tiles plus a fixed
  // start/drain cost; splitting adds that cost per CTA and a merge. A count
  // that leaves a nearly empty last wave loses to one that fills it.
  const int64_t ctas = static_cast<int64_t>(pb.batch) * pb.num_kv_heads;
  const int64_t slots = static_cast<int64_t>(multiprocessor_count(pb.device_ordinal)) *
                        cuda::decode_ctas_per_sm(static_cast<int32_t>(pb.head_dim));
  int min_split = kMinSplitTokens;
  if (ctas * ((max_len + min_split - 1) / min_split) * 4 < slots) min_split = kTile;
  int64_t limit = (max_len + min_split - 1) / min_split;
  if (limit > cuda::kDecodeMaxSplits) limit = cuda::kDecodeMaxSplits;
  int64_t wanted = 1;
  double best = 0;
  for (int64_t s = 1; s <= limit; ++s) {
    const int64_t per_cta = (tiles_total + s - 1) / s;
    const int64_t waves = (ctas * s + slots - 1) / slots;
    const double cost =
        static_cast<double>(waves) * (static_cast<double>(per_cta) + kCtaCostTiles) +
        (s > 1 ? kMergeCostTiles : 0.0);
    if (s == 1 || cost < best * 0.98) best = cost, wanted = s;
  }
  const int64_t by_max_len = (max_len + kMaxSplitTokens - 1) / kMaxSplitTokens;
  if (wanted < by_max_len) wanted = by_max_len;
  if (pb.batch > 1 && max_len > kMaxSplitTokens) {
    int64_t ragged = (max_len + kRaggedSplitTokens - 1) / kRaggedSplitTokens;
    if (pb.batch >= kRaggedMinRows && ctas * 3 >= slots) {
      const int64_t by_slots = (kRaggedCtasPerSlot * slots + ctas - 1) / ctas;
      const int64_t cap = max_len / kRaggedMinTokens;
      ragged = std::max(ragged, std::min(by_slots, cap));
    }
    if (wanted < ragged) wanted = ragged;
  }
  SplitPlan plan = make_plan(tiles_total, static_cast<int>(wanted));
  if (limit_by_workspace && plan.splits > 1) {
    // Fewer partitions when the caller's workspace cannot hold them all.
    const size_t per_split = workspace_bytes(pb, 2) / 2;
    size_t fit = pb.workspace == nullptr ? 0 : pb.workspace_size / per_split;
    if (pb.workspace != nullptr && !aligned16(pb.workspace)) fit = 0;
    if (fit < static_cast<size_t>(plan.splits))
      plan = make_plan(tiles_total, fit < 2 ? 1 : static_cast<int>(fit));
  }
  return plan;
}

// FD_DECODE_CHECK_INDICES: the one synchronising path. Copies seq_lens and
// block tables to the host and checks them before anything is launched.
void check_indices_on_host(const DecodeProblem &pb, cudaStream_t stream) {
  std::vector<int32_t> lens(pb.batch);
  std::vector<int32_t> tables(static_cast<size_t>(pb.batch) * pb.max_blocks_per_seq);
  check_cuda(cudaMemcpyAsync(lens.data(), pb.seq_lens, lens.size() * sizeof(int32_t),
                             cudaMemcpyDefault, stream),
             "copying seq_lens to the host");
  check_cuda(cudaMemcpyAsync(tables.data(), pb.block_tables, tables.size() * sizeof(int32_t),
                             cudaMemcpyDefault, stream),
             "copying block_tables to the host");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  // The same checks as the CPU backend's, including seq_len <= the resolved
  // max_seq_len_hint: the split plan covers only that many tokens, so a
  // longer row would otherwise be cut short silently.
  check_decode_indices(pb, lens.data(), tables.data());
}

// Makes `ordinal` the calling thread's current device for the scope and
// restores the previous one afterwards.
class DeviceScope {
 public:
  explicit DeviceScope(int32_t ordinal) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != ordinal) check_cuda(cudaSetDevice(ordinal), "cudaSetDevice");
  }
  ~DeviceScope() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope &) = delete;
  DeviceScope &operator=(const DeviceScope &) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

size_t decode_cuda_workspace_size(const DecodeProblem &problem) {
  require_cuda_device(problem.device_ordinal);
  check_supported(problem);
  return workspace_bytes(problem, choose_splits(problem, false).splits);
}

void decode_cuda(const DecodeProblem &problem) {
  require_cuda_device(problem.device_ordinal);
  check_supported(problem);
  const SplitPlan plan = choose_splits(problem, problem.num_splits == 0);
  const size_t need = workspace_bytes(problem, plan.splits);
  if (need > 0) {
    if (problem.workspace == nullptr || problem.workspace_size < need)
      fail(FD_ERR_INVALID_ARGUMENT,
           "workspace_size %zu is too small: num_splits %d needs %zu bytes "
           "(see fd_decode_workspace_size)",
           problem.workspace == nullptr ? size_t{0} : problem.workspace_size, plan.splits, need);
    if (!aligned16(problem.workspace))
      fail(FD_ERR_UNSUPPORTED, "workspace must be 16-byte aligned on CUDA");
  }
  DeviceScope scope(problem.device_ordinal);
  cudaStream_t stream = reinterpret_cast<cudaStream_t>(problem.stream);
  if (problem.flags & FD_DECODE_CHECK_INDICES) check_indices_on_host(problem, stream);

  cuda::DecodeLaunch l;
  l.dtype = problem.dtype;
  l.dim_major = problem.layout == FD_LAYOUT_DIM_MAJOR;
  l.head_dim = static_cast<int32_t>(problem.head_dim);
  l.q = problem.q;
  l.k = problem.k;
  l.v = problem.v;
  l.out = problem.out;
  l.block_tables = problem.block_tables;
  l.seq_lens = problem.seq_lens;
  l.stride_block = problem.stride_block;
  l.stride_head = problem.stride_head;
  l.stride_token = problem.stride_token;
  l.stride_dim = problem.stride_dim;
  l.batch = static_cast<int32_t>(problem.batch);
  l.num_kv_heads = static_cast<int32_t>(problem.num_kv_heads);
  l.group_size = static_cast<int32_t>(problem.group_size);
  l.block_size_log2 = log2_exact(problem.block_size);
  l.num_blocks = static_cast<int32_t>(problem.num_blocks);
  l.max_blocks_per_seq = static_cast<int32_t>(problem.max_blocks_per_seq);
  l.scale_log2 = problem.sm_scale * 1.4426950408889634f;
  l.num_splits = plan.splits;
  l.tiles_per_split = plan.tiles_per_split;
  if (plan.splits > 1) {
    l.partial_o = static_cast<float *>(problem.workspace);
    l.partial_ml = l.partial_o + static_cast<size_t>(problem.batch) * problem.num_q_heads *
                                     plan.splits * problem.head_dim;
  }
  l.stream = stream;
  check_cuda(cuda::launch_decode(l), "launching the CUDA decode kernel");
}

}  // namespace fd
