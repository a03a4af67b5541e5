// Host-side check of a decode problem's seq_lens and block tables (S2). The
// CPU backend always runs it; the CUDA backend can run it on host copies when
// the caller asks for FD_DECODE_CHECK_INDICES.
#pragma once

#include <cstdint>

#include "attention/decode_problem.hpp"

namespace fd {

// Throws FD_ERR_INVALID_ARGUMENT, naming the row and the value, unless every
// seq_lens[r] lies in [0, max_blocks_per_seq * block_size] and within the
// resolved max_seq_len, and every block id a non-empty row uses (its first
// ceil(seq_len / block_size) table entries) lies in [0, num_blocks).
// Also that no attention sink is NaN. With several query tokens per row,
// that q_indptr starts at 0 and
// gives every row 1 .. min(seq_len, max_q_len_hint if given) tokens.
// `seq_lens`, `block_tables` and `q_indptr` are host copies of the
// problem's arrays (q_indptr null when the problem has none).
void check_decode_indices(const DecodeProblem &problem, const int32_t *seq_lens,
                          const int32_t *block_tables, const int32_t *q_indptr);

}  // namespace fd
