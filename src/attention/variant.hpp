// The attention variant: how a raw q.k dot product becomes a softmax logit
// and which K/V tokens a query sees. One policy, read by the CPU backend and
// the CUDA kernels alike, so a new variant (window, soft-cap, sinks) is a
// field in Variant, its resolution in the decode front end, and its rule here.
#pragma once

#include <cstdint>

#include "attention/host_device.hpp"

namespace fd {

// The resolved variant section of fd_decode_params: trivially copyable, so
// it travels to the kernels by value.
struct Variant {
  float sm_scale = 1.f;  // > 0 (0 in the params resolves to 1/sqrt(head_dim))
};

// The policy the backends apply. Logits are either natural (CPU: q is
// multiplied by query_scale() once, then exp) or base 2 (CUDA: the raw dot
// times log2_scale(), then exp2); both give softmax(sm_scale * q.k).
struct VariantPolicy {
  float sm_scale;
  float log2_scale;  // sm_scale * log2(e)

  FD_HD static VariantPolicy of(const Variant &v) {
    VariantPolicy p;
    p.sm_scale = v.sm_scale;
    p.log2_scale = v.sm_scale * 1.4426950408889634f;
    return p;
  }
  // Factor a CPU backend folds into q before the dot products.
  FD_HD float query_scale() const { return sm_scale; }
  // Natural logit of a dot product of a pre-scaled q (CPU).
  FD_HD float logit(float scaled_dot) const { return scaled_dot; }
  // Base-2 logit of a raw dot product (CUDA).
  FD_HD float logit_log2(float dot) const { return dot * log2_scale; }
  // K/V tokens [first_visible(len), len) are attended by a row's query.
  FD_HD int32_t first_visible(int32_t /*seq_len*/) const { return 0; }
};

}  // namespace fd
