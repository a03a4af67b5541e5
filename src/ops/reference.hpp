// Dense reference attention (docs/semantics.md S2, implementation 1): plain,
// single-threaded C++ over contiguous per-row K/V, with the multi-token rule
// of S2.2 and the variants of S2.3 written out directly. It is the yardstick the
// paged CPU backend and the CUDA kernel are checked against, so it favours
// obviousness over speed.
#pragma once

#include <cstdint>

namespace fd {

struct DenseAttentionArgs {
  int32_t dtype = 0;
  uint32_t batch = 0;
  uint32_t num_q_heads = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t max_seq_len = 0;
  const void *q = nullptr;            // [batch, num_q_heads, head_dim]
  const void *k = nullptr;            // [batch, num_kv_heads, max_seq_len, head_dim]
  const void *v = nullptr;            // same shape as k
  const int32_t *seq_lens = nullptr;  // [batch], each in [0, max_seq_len]
  float sm_scale = 0.f;               // 0 means 1/sqrt(head_dim)
  void *out = nullptr;                // [batch, num_q_heads, head_dim]
  // Several query tokens per row (S2.2): [batch + 1] offsets into q and out
  // ([q_indptr[batch], num_q_heads, head_dim]); null: one token per row.
  const int32_t *q_indptr = nullptr;
  // The variants of S2.3, off by default.
  float logit_softcap = 0.f;
  int32_t sliding_window = 0;
  const float *sinks = nullptr;  // [num_q_heads] or null
};

// Checks every argument (throws fd::Error naming the parameter) and returns
// the resolved softmax scale. Reads seq_lens; writes nothing.
float check_dense_attention_args(const DenseAttentionArgs &args);

// Computes the attention into args.out. Arguments must have been checked.
void reference_attention_dense(const DenseAttentionArgs &args, float sm_scale);

}  // namespace fd
