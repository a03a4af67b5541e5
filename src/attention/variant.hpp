// The attention variant: how a raw q.k dot product becomes a softmax logit
// and which K/V tokens a query sees. One policy, read by the CPU backend and
// the CUDA kernels alike, so a new variant (window, soft-cap, sinks) is a
// field in Variant, its resolution in the decode front end, and its rule here.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.hpp"

namespace fd {

// The resolved variant section of fd_decode_params: trivially copyable, so
// it travels to the kernels by value.
struct Variant {
  float sm_scale = 1.f;          // > 0 (0 in the params resolves to 1/sqrt(head_dim))
  float logit_softcap = 0.f;     // 0: none; > 0: scores become cap * tanh(score / cap)
  int32_t sliding_window = 0;    // 0: none; w > 0: a query at p sees p - w + 1 .. p
  const float *sinks = nullptr;  // null or [num_q_heads]: logits in each head's denominator
  bool is_plain() const { return logit_softcap == 0.f && sliding_window == 0 && sinks == nullptr; }
};

// The policy the backends apply. Logits are either natural (CPU: q is
// multiplied by query_scale() once, then exp) or base 2 (CUDA: the raw dot
// times log2_scale(), then exp2); both give softmax(sm_scale * q.k), with
// the same soft-cap, window and sinks.
struct VariantPolicy {
  float sm_scale;
  float log2_scale;  // sm_scale * log2(e)
  float softcap;     // 0: none
  int32_t window;    // 0: none
  // Soft-cap in base 2 (CUDA): cap * log2(e), and 2 / cap (see softcap_log2).
  float softcap_log2_cap;
  float softcap_log2_in;

  static constexpr float kLog2e = 1.4426950408889634f;

  FD_HD static VariantPolicy of(const Variant &v) {
    VariantPolicy p;
    p.sm_scale = v.sm_scale;
    p.log2_scale = v.sm_scale * kLog2e;
    p.softcap = v.logit_softcap;
    p.window = v.sliding_window;
    p.softcap_log2_cap = v.logit_softcap * kLog2e;
    p.softcap_log2_in = v.logit_softcap > 0.f ? 2.f / v.logit_softcap : 0.f;
    return p;
  }
  // Factor a CPU backend folds into q before the dot products.
  FD_HD float query_scale() const { return sm_scale; }
  // Natural logit of a dot product of a pre-scaled q (CPU): the soft-cap,
  // when there is one, squashes it into (-cap, cap).
  FD_HD float logit(float scaled_dot) const {
    return softcap > 0.f ? softcap * tanhf(scaled_dot / softcap) : scaled_dot;
  }
  // Base-2 logit of a raw dot product (CUDA, no soft-cap).
  FD_HD float logit_log2(float dot) const { return dot * log2_scale; }
  // The soft-cap on a base-2 logit x = z log2(e) (CUDA; only when softcap >
  // 0): cap tanh(z / cap) log2(e) = C (1 - 2 / (1 + 2^(2 x / cap))), C = cap
  // log2(e). One exp2 and one reciprocal; the absolute error stays near
  // C x 2^-22 (no cancellation matters: the softmax sees absolute logit
  // errors), and the limits are exact: 2^(...) overflowing gives C, zero -C.
  // (exp2f, not exp2_approx: with the SFU-only exponential the head_dim 128
  // variant kernel spilled at its 168-register cap and ran 1% slower.)
  FD_HD float softcap_log2(float x) const {
    const float e = exp2f(x * softcap_log2_in);
#if defined(__CUDA_ARCH__)
    return softcap_log2_cap - __fdividef(2.f * softcap_log2_cap, 1.f + e);
#else
    return softcap_log2_cap - 2.f * softcap_log2_cap / (1.f + e);
#endif
  }
  // First position a query at `position` attends (the sliding window).
  FD_HD int64_t first_visible(int64_t position) const {
    const int64_t first = window > 0 ? position - window + 1 : 0;
    return first > 0 ? first : 0;
  }
  // A sink logit (natural, per query head) in base 2 (CUDA).
  FD_HD static float sink_log2(float sink) {
    return sink * kLog2e;
  }
};

}  // namespace fd
