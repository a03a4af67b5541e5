#include "attention/decode_cpu_indices.hpp"

#include <cmath>
#include <cstddef>

#include "core/error.hpp"

namespace fd {

void check_decode_indices(const DecodeProblem &pb, const int32_t *seq_lens,
                          const int32_t *block_tables, const int32_t *q_indptr) {
  if (const float *sinks = pb.variant.sinks)
    for (uint32_t h = 0; h < pb.num_q_heads; ++h)
      if (std::isnan(sinks[h]))
        fail(FD_ERR_INVALID_ARGUMENT, "sinks[%u] is NaN (-inf: no sink for that head)", h);
  if (q_indptr != nullptr && q_indptr[0] != 0)
    fail(FD_ERR_INVALID_ARGUMENT, "q_indptr[0] must be 0, got %d", static_cast<int>(q_indptr[0]));
  // Exact in 64 bits: both factors are below 2^32.
  const uint64_t capacity = uint64_t{pb.max_blocks_per_seq} * pb.kv.block_size;
  for (uint32_t r = 0; r < pb.batch; ++r) {
    const int32_t len = seq_lens[r];
    if (len < 0 || static_cast<uint64_t>(len) > capacity)
      fail(FD_ERR_INVALID_ARGUMENT,
           "seq_lens[%u] = %d (row %u) is out of range [0, max_blocks_per_seq*block_size = %llu]",
           r, static_cast<int>(len), r, static_cast<unsigned long long>(capacity));
    if (len > pb.max_seq_len)
      fail(FD_ERR_INVALID_ARGUMENT, "seq_lens[%u] = %d (row %u) exceeds max_seq_len_hint = %d", r,
           static_cast<int>(len), r, static_cast<int>(pb.max_seq_len));
    if (q_indptr != nullptr) {
      // Causal queries: q_len tokens ending at position len - 1.
      const int64_t q_len = int64_t{q_indptr[r + 1]} - q_indptr[r];
      if (q_len < 1)
        fail(FD_ERR_INVALID_ARGUMENT,
             "q_indptr[%u] = %d and q_indptr[%u] = %d give row %u %lld query tokens: q_indptr "
             "must increase (every row at least one token)",
             r, static_cast<int>(q_indptr[r]), r + 1, static_cast<int>(q_indptr[r + 1]), r,
             static_cast<long long>(q_len));
      if (q_len > len)
        fail(FD_ERR_INVALID_ARGUMENT,
             "row %u has %lld query tokens but seq_lens[%u] = %d: a row's queries are its last "
             "q_len tokens, so q_len <= seq_len",
             r, static_cast<long long>(q_len), r, static_cast<int>(len));
      if (q_len > pb.max_q_len && pb.max_q_len_given)
        fail(FD_ERR_INVALID_ARGUMENT, "row %u has %lld query tokens, more than max_q_len_hint = %d",
             r, static_cast<long long>(q_len), static_cast<int>(pb.max_q_len));
    }
    const uint64_t used = (static_cast<uint64_t>(len) + pb.kv.block_size - 1) / pb.kv.block_size;
    const int32_t *table = block_tables + static_cast<size_t>(r) * pb.max_blocks_per_seq;
    for (uint64_t i = 0; i < used; ++i)
      if (table[i] < 0 || static_cast<uint32_t>(table[i]) >= pb.kv.num_blocks)
        fail(
            FD_ERR_INVALID_ARGUMENT,
            "block_tables[%u][%llu] = %d (row %u, seq_len %d) is out of range [0, num_blocks = %u)",
            r, static_cast<unsigned long long>(i), static_cast<int>(table[i]), r,
            static_cast<int>(len), pb.kv.num_blocks);
  }
}

}  // namespace fd
