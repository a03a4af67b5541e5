// The CUDA backend's split-KV planning: from a resolved decode problem and
// the device's CTA slots, the work list (decode_work.hpp) a call runs: how
// many splits per (row, KV head), lead units, whether the kernel runs in
// its deep shape, and whether the swapped FP8 kernel stages by TMA. Plain C++ with no CUDA header
// (src/cuda/decode_cuda.cpp fills DecodeSlots from the device and the kernels), so the CPU unit
// suite tests/unit_decode_splits.cpp checks the choices. Thread contract: pure functions of their
// arguments.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention/decode_problem.hpp"
#include "attention/decode_work.hpp"

namespace fd {
namespace cuda {

// What the planning needs of the device and the kernel a problem takes.
struct DecodeSlots {
  int64_t sms = 1;               // multiprocessors of the device
  int32_t ctas_per_sm = 1;       // resident CTAs per SM of the kernel the problem takes
  int32_t deep_ctas_per_sm = 0;  // of the deep shape (Config's kDeep; 0: none), the
                                 // swapped kernel's for the calls it serves
  bool sm90_device = false;      // compute capability 9.0 (the Hopper kernel may serve)
};

// Query tokens of one query tile, and query tiles per (row, KV head).
int32_t query_tile_tokens(const DecodeProblem &pb);
int64_t query_tiles(const DecodeProblem &pb);

// Whether a call of this problem runs the Hopper kernel
// (kernels/decode_sm90.cu) on a device that is (`sm90_device`) or is not of
// compute capability 9.0.
bool takes_sm90(const DecodeProblem &pb, bool sm90_device);

// Whether a call of this problem runs the swapped-operand FP8 kernel
// (kernels/decode_swapped.cuh; attention/swap_choice.hpp's rule). Its CTAs
// per SM differ from the m-tile kernel's (DecodeSlots::ctas_per_sm
// is the swapped kernel's for these calls).
bool takes_swapped(const DecodeProblem &pb);

// Workspace bytes of a work list's partials (0 without splits).
size_t decode_workspace_bytes(const DecodeProblem &pb, const DecodeWorkList &work);

// The work list for rows of at most `max_len` keys (the span the plan
// counts): pb.num_splits when given (1: none), else the modelled best, with
// sm90_device, deep_stages and tma_stages set. limit_by_workspace: fewer splits when
// pb's workspace cannot hold the partials. total_len: the sum of the rows'
// spans when the plan knows them (host lengths), else 0; with it a batch of
// unequal rows is told from a uniform one. spans: those spans (pb.batch of
// them, host memory, or null): a batch they show to be ragged takes the
// split count of least modelled time for exactly those rows.
DecodeWorkList plan_decode_splits(const DecodeProblem &pb, int32_t max_len, bool limit_by_workspace,
                                  const DecodeSlots &slots, int64_t total_len = 0,
                                  const int32_t *spans = nullptr);

}  // namespace cuda
}  // namespace fd
