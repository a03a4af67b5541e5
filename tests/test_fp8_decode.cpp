/* fd_decode on the CPU over FP8 K/V (S1.1): against fd_reference_attention
 * (f32) over the dequantised K/V (stored x scale), for E4M3 and E5M2, both
 * layouts, GQA groups, rows of several 256-token chunks, q = out in bf16,
 * f16 and f32 and q != out; the error against the original (unquantised)
 * values is printed and bounded; k_scale / v_scale on a bf16 cache equal
 * scaling K / V by hand; FP8 parameter errors. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "fd_test.h"
#include "test_fp8_support.h"

namespace {

struct Case {
  int32_t kv_dtype = FD_DTYPE_FP8_E4M3;
  int32_t q_dtype = FD_DTYPE_BF16, out_dtype = FD_DTYPE_BF16;
  int32_t layout = FD_LAYOUT_TOKEN_MAJOR;
  uint32_t hq = 8, hkv = 2, dim = 64, bs = 16;
  std::vector<int32_t> lens = {1, 37, 600};
  float amplitude = 1.f; /* of the original K and V */
  uint64_t seed = 7;
};

/* Original K/V (dense, f32), their paged FP8 codes and the scales a caller
 * would pick (amax / the type's largest value, as vLLM does). */
struct Problem {
  Case c;
  uint32_t batch = 0, max_len = 0, mbps = 0, num_blocks = 0;
  float k_scale = 1.f, v_scale = 1.f;
  std::vector<float> k_orig, v_orig, k_deq, v_deq; /* [batch, hkv, max_len, dim] */
  std::vector<uint8_t> q, k_cache, v_cache;
  std::vector<int32_t> tables;
};

size_t paged_index(const Problem &p, int32_t block, uint32_t h, uint32_t t, uint32_t d) {
  const size_t H = p.c.hkv, B = p.c.bs, D = p.c.dim;
  const size_t head = ((size_t)block * H + h) * B * D;
  return p.c.layout == FD_LAYOUT_TOKEN_MAJOR ? head + (size_t)t * D + d : head + (size_t)d * B + t;
}

Problem build(const Case &c) {
  Problem p;
  p.c = c;
  fd_test_rng rng = {c.seed};
  p.batch = (uint32_t)c.lens.size();
  p.max_len = (uint32_t)*std::max_element(c.lens.begin(), c.lens.end());
  p.mbps = (p.max_len + c.bs - 1) / c.bs;
  p.num_blocks = p.batch * p.mbps + 1;
  const size_t dense = (size_t)p.batch * c.hkv * p.max_len * c.dim;
  p.k_orig.resize(dense);
  p.v_orig.resize(dense);
  float k_amax = 0, v_amax = 0;
  for (size_t i = 0; i < dense; ++i) {
    /* bf16 values, as a model would hand them over. */
    p.k_orig[i] = fd_test_bf16_to_f32(fd_test_f32_to_bf16(c.amplitude * fd_test_normal(&rng)));
    p.v_orig[i] = fd_test_bf16_to_f32(fd_test_f32_to_bf16(c.amplitude * fd_test_normal(&rng)));
    k_amax = std::max(k_amax, std::fabs(p.k_orig[i]));
    v_amax = std::max(v_amax, std::fabs(p.v_orig[i]));
  }
  p.k_scale = k_amax / f8_max(c.kv_dtype);
  p.v_scale = v_amax / f8_max(c.kv_dtype);
  /* q = 3 N(0, 1): peaked softmax. */
  const size_t q_elems = (size_t)p.batch * c.hq * c.dim;
  p.q.resize(q_elems * fd::dtype_size(c.q_dtype));
  for (size_t i = 0; i < q_elems; ++i)
    f8_store(p.q.data(), i, c.q_dtype, 3.f * fd_test_normal(&rng));
  /* Physical blocks: a random permutation. */
  std::vector<int32_t> perm(p.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[fd_test_next(&rng) % i]);
  p.tables.assign((size_t)p.batch * p.mbps, -1);
  const size_t paged = (size_t)p.num_blocks * c.hkv * c.bs * c.dim;
  p.k_cache.assign(paged, 0x7f); /* NaN where nothing is stored: must never be read */
  p.v_cache.assign(paged, 0x7f);
  p.k_deq.assign(dense, 0.f);
  p.v_deq.assign(dense, 0.f);
  size_t next = 0;
  for (uint32_t r = 0; r < p.batch; ++r) {
    for (uint32_t b = 0; b * c.bs < (uint32_t)c.lens[r]; ++b)
      p.tables[r * p.mbps + b] = perm[next++];
    for (uint32_t h = 0; h < c.hkv; ++h)
      for (uint32_t t = 0; t < (uint32_t)c.lens[r]; ++t)
        for (uint32_t d = 0; d < c.dim; ++d) {
          const size_t di = (((size_t)r * c.hkv + h) * p.max_len + t) * c.dim + d;
          const size_t pi = paged_index(p, p.tables[r * p.mbps + t / c.bs], h, t % c.bs, d);
          const uint8_t kc = f8_quantise(c.kv_dtype, p.k_orig[di], p.k_scale);
          const uint8_t vc = f8_quantise(c.kv_dtype, p.v_orig[di], p.v_scale);
          p.k_cache[pi] = kc;
          p.v_cache[pi] = vc;
          p.k_deq[di] = f8_value(c.kv_dtype, kc) * p.k_scale;
          p.v_deq[di] = f8_value(c.kv_dtype, vc) * p.v_scale;
        }
  }
  return p;
}

fd_decode_params params_for(Problem &p, std::vector<uint8_t> &out) {
  fd_decode_params prm;
  fd_decode_params_init(&prm);
  prm.batch = p.batch;
  prm.num_q_heads = p.c.hq;
  prm.num_kv_heads = p.c.hkv;
  prm.head_dim = p.c.dim;
  prm.block_size = p.c.bs;
  prm.num_blocks = p.num_blocks;
  prm.max_blocks_per_seq = p.mbps;
  prm.q_dtype = p.c.q_dtype;
  prm.kv_dtype = p.c.kv_dtype;
  prm.out_dtype = p.c.out_dtype;
  prm.layout = p.c.layout;
  prm.q = p.q.data();
  prm.k_cache = p.k_cache.data();
  prm.v_cache = p.v_cache.data();
  prm.block_tables = p.tables.data();
  prm.seq_lens = p.c.lens.data();
  out.assign((size_t)p.batch * p.c.hq * p.c.dim * fd::dtype_size(p.c.out_dtype), 0xcd);
  prm.out = out.data();
  prm.k_scale = p.k_scale;
  prm.v_scale = p.v_scale;
  prm.cpu_threads = 2;
  return prm;
}

/* f32 dense reference over the given K/V, with q as the kernel reads it. */
std::vector<float> reference(const Problem &p, const std::vector<float> &k,
                             const std::vector<float> &v) {
  const size_t q_elems = (size_t)p.batch * p.c.hq * p.c.dim;
  std::vector<float> q(q_elems), out(q_elems);
  for (size_t i = 0; i < q_elems; ++i) q[i] = f8_load(p.q.data(), i, p.c.q_dtype);
  fd_reference_params rp;
  fd_reference_params_init(&rp);
  rp.dtype = FD_DTYPE_F32;
  rp.batch = p.batch;
  rp.num_q_heads = p.c.hq;
  rp.num_kv_heads = p.c.hkv;
  rp.head_dim = p.c.dim;
  rp.max_seq_len = p.max_len;
  rp.q = q.data();
  rp.k = k.data();
  rp.v = v.data();
  rp.seq_lens = p.c.lens.data();
  rp.out = out.data();
  FD_ASSERT_OK(fd_reference_attention(&rp));
  return out;
}

std::vector<float> as_f32(const std::vector<uint8_t> &buf, int32_t dtype, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = f8_load(buf.data(), i, dtype);
  return v;
}

/* Worst errors over the whole run, printed at the end of the test: all
 * cases against the dequantised K/V; against the original values by the
 * amplitude of K and V (N(0, 1), the measure, and the others). */
struct Worst {
  double deq = 0, orig_unit = 0, orig_other = 0;
  double mean_sum = 0; /* of the mean row error vs the original, amplitude 1 */
  int mean_cases = 0;
};

/* orig_bound applies to K/V of amplitude 1 (a larger amplitude sharpens the
 * softmax, so the same relative K error moves the weights more). It is a
 * property of the format, not of the kernel: with q = 3 N(0,1) the logits
 * have a standard deviation of about 3, and E4M3's relative error of up to
 * 1/16 per K element moves the few largest weights by tens of percent. */
void run_case(const Case &c, Worst &worst, double orig_bound) {
  Problem p = build(c);
  std::vector<uint8_t> out;
  fd_decode_params prm = params_for(p, out);
  FD_ASSERT_OK(fd_decode(&prm));
  const std::vector<float> got = as_f32(out, c.out_dtype, (size_t)p.batch * c.hq * c.dim);
  const double deq = f8_worst_row_error(got, reference(p, p.k_deq, p.v_deq), c.dim);
  double mean = 0;
  const double orig = f8_worst_row_error(got, reference(p, p.k_orig, p.v_orig), c.dim, &mean);
  if (c.amplitude == 1.f) worst.mean_sum += mean, worst.mean_cases += 1;
  worst.deq = std::max(worst.deq, deq);
  double &w = c.amplitude == 1.f ? worst.orig_unit : worst.orig_other;
  w = std::max(w, orig);
  if (!(deq <= 5e-3) || !(c.amplitude != 1.f || orig <= orig_bound)) {
    print_error(
        "kv %s q %s out %s layout %d hq %u hkv %u dim %u: error vs dequantised %.3g "
        "(bound 5e-3), vs original %.3g (bound %.3g)\n",
        fd::dtype_name(c.kv_dtype), fd::dtype_name(c.q_dtype), fd::dtype_name(c.out_dtype),
        c.layout, c.hq, c.hkv, c.dim, deq, orig, orig_bound);
    fail();
  }
}

void test_against_dequantised_reference(void **state) {
  (void)state;
  for (int32_t kv : {FD_DTYPE_FP8_E4M3, FD_DTYPE_FP8_E5M2}) {
    Worst worst;
    /* E5M2 keeps two mantissa bits: its error against the original values
     * is about twice E4M3's. */
    const double orig_bound = kv == FD_DTYPE_FP8_E4M3 ? 0.35 : 0.7;
    uint64_t seed = 1;
    for (int32_t layout : {FD_LAYOUT_TOKEN_MAJOR, FD_LAYOUT_DIM_MAJOR})
      for (int32_t qd : {FD_DTYPE_BF16, FD_DTYPE_F16, FD_DTYPE_F32})
        for (uint32_t hq : {2u, 8u, 16u}) {
          Case c;
          c.kv_dtype = kv;
          c.q_dtype = c.out_dtype = qd;
          c.layout = layout;
          c.hq = hq;
          c.dim = hq == 16 ? 128 : 64;
          c.bs = hq == 2 ? 8 : 16;
          c.amplitude = hq == 8 ? 1.f : hq == 2 ? 0.01f : 3.f; /* scales far from 1 too */
          c.seed = seed++;
          run_case(c, worst, orig_bound);
        }
    /* q and out of different types. */
    Case c;
    c.kv_dtype = kv;
    c.q_dtype = FD_DTYPE_F32;
    c.out_dtype = FD_DTYPE_BF16;
    run_case(c, worst, orig_bound);
    c.q_dtype = FD_DTYPE_BF16;
    c.out_dtype = FD_DTYPE_F16;
    run_case(c, worst, orig_bound);
    print_message(
        "fd_decode CPU, kv %s, q = 3 N(0,1): worst row-relative error %.3g vs f32 "
        "attention over the dequantised K/V; vs the original bf16 K/V %.3g (K, V ~ "
        "N(0,1); mean over rows %.3g), %.3g (amplitudes 0.01 and 3)\n",
        fd::dtype_name(kv), worst.deq, worst.orig_unit, worst.mean_sum / worst.mean_cases,
        worst.orig_other);
  }
}

/* k_scale / v_scale on a bf16 cache: the same as K and V scaled by hand
 * (powers of two, so the scaled values are exact and the bits equal). */
void test_scales_on_bf16_cache(void **state) {
  (void)state;
  Case c;
  c.kv_dtype = FD_DTYPE_BF16;
  Problem p = build(c);
  /* bf16 pages holding the FP8 pages' stored values (exact in bf16), and
   * the same times 0.25 (K) and 8 (V). */
  const size_t paged = (size_t)p.num_blocks * c.hkv * c.bs * c.dim;
  std::vector<uint8_t> k(paged * 2), v(paged * 2), k4(paged * 2), v4(paged * 2);
  for (size_t i = 0; i < paged; ++i) {
    const float kx = f8_value(FD_DTYPE_FP8_E4M3, p.k_cache[i]);
    const float vx = f8_value(FD_DTYPE_FP8_E4M3, p.v_cache[i]);
    f8_store(k.data(), i, FD_DTYPE_BF16, kx);
    f8_store(v.data(), i, FD_DTYPE_BF16, vx);
    f8_store(k4.data(), i, FD_DTYPE_BF16, kx * 0.25f);
    f8_store(v4.data(), i, FD_DTYPE_BF16, vx * 8.f);
  }
  p.c.kv_dtype = FD_DTYPE_BF16;
  auto decode = [&](const std::vector<uint8_t> &kc, const std::vector<uint8_t> &vc, float ks,
                    float vs, uint32_t struct_size) {
    std::vector<uint8_t> out;
    fd_decode_params prm = params_for(p, out);
    prm.k_cache = kc.data();
    prm.v_cache = vc.data();
    prm.k_scale = ks;
    prm.v_scale = vs;
    prm.struct_size = struct_size;
    FD_ASSERT_OK(fd_decode(&prm));
    return out;
  };
  const uint32_t full = sizeof(fd_decode_params);
  const std::vector<uint8_t> scaled = decode(k, v, 0.25f, 8.f, full);
  const std::vector<uint8_t> hand = decode(k4, v4, 1.f, 1.f, full);
  assert_memory_equal(scaled.data(), hand.data(), hand.size());
  /* Scales of 1 (the default) give the bits of a 0.1-era caller's struct
   * (without them; the values set beyond its struct_size are not read). */
  const std::vector<uint8_t> one = decode(k, v, 1.f, 1.f, full);
  const std::vector<uint8_t> older =
      decode(k, v, 5.f, 5.f, (uint32_t)offsetof(fd_decode_params, k_scale));
  assert_memory_equal(one.data(), older.data(), one.size());
}

/* An FP8 cache read with other scales than it was written with equals the
 * dequantisation with those scales (scales are the reader's). */
void test_other_scales_and_plan(void **state) {
  (void)state;
  Case c;
  c.lens = {300, 5};
  Problem p = build(c);
  std::vector<uint8_t> out;
  fd_decode_params prm = params_for(p, out);
  prm.k_scale = p.k_scale * 2.f;
  prm.v_scale = p.v_scale * 0.5f;
  FD_ASSERT_OK(fd_decode(&prm));
  std::vector<float> k2(p.k_deq), v2(p.v_deq);
  for (float &x : k2) x *= 2.f;
  for (float &x : v2) x *= 0.5f;
  const double err = f8_worst_row_error(as_f32(out, c.out_dtype, (size_t)p.batch * c.hq * c.dim),
                                        reference(p, k2, v2), c.dim);
  assert_true(err <= 5e-3);
  /* A plan serves runs with any scales (they are not part of the plan). */
  fd_decode_plan *plan = NULL;
  FD_ASSERT_OK(fd_decode_plan_create(&prm, NULL, &plan));
  std::vector<uint8_t> out_run(out.size(), 0);
  prm.out = out_run.data();
  FD_ASSERT_OK(fd_decode_run(plan, &prm));
  assert_memory_equal(out.data(), out_run.data(), out.size());
  fd_decode_plan_destroy(plan);
}

void test_errors(void **state) {
  (void)state;
  Case c;
  c.lens = {20};
  Problem p = build(c);
  std::vector<uint8_t> out;
  const fd_decode_params good = params_for(p, out);
  const std::vector<uint8_t> before = out;
  struct Bad {
    void (*edit)(fd_decode_params &);
    fd_status status;
    const char *message;
  } cases[] = {
      {[](fd_decode_params &q) { q.k_scale = 0.f; }, FD_ERR_INVALID_ARGUMENT,
       "k_scale must be finite and > 0"},
      {[](fd_decode_params &q) { q.k_scale = -2.f; }, FD_ERR_INVALID_ARGUMENT, "k_scale"},
      {[](fd_decode_params &q) { q.v_scale = NAN; }, FD_ERR_INVALID_ARGUMENT, "v_scale"},
      {[](fd_decode_params &q) { q.v_scale = -INFINITY; }, FD_ERR_INVALID_ARGUMENT, "v_scale"},
      {[](fd_decode_params &q) { q.k_scale = INFINITY; }, FD_ERR_INVALID_ARGUMENT, "k_scale"},
      {[](fd_decode_params &q) { q.q_dtype = FD_DTYPE_FP8_E4M3; }, FD_ERR_INVALID_ARGUMENT,
       "q_dtype 3 (fp8_e4m3) is a storage type"},
      {[](fd_decode_params &q) { q.out_dtype = FD_DTYPE_FP8_E5M2; }, FD_ERR_INVALID_ARGUMENT,
       "out_dtype 4 (fp8_e5m2) is a storage type"},
      {[](fd_decode_params &q) { q.kv_dtype = 5; }, FD_ERR_INVALID_ARGUMENT, "kv_dtype 5"},
      /* f32 is a CPU type: refused for CUDA before the device is looked at. */
      {[](fd_decode_params &q) {
         q.device.type = FD_DEVICE_CUDA;
         q.q_dtype = q.out_dtype = FD_DTYPE_F32;
       },
       FD_ERR_UNSUPPORTED, "q_dtype f32 is served by the CPU backend only"},
  };
  for (const Bad &b : cases) {
    fd_decode_params prm = good;
    b.edit(prm);
    FD_ASSERT_FAILS(fd_decode(&prm), b.status, b.message);
    assert_memory_equal(before.data(), out.data(), out.size());
    size_t bytes = 777;
    FD_ASSERT_FAILS(fd_decode_workspace_size(&prm, &bytes), b.status, b.message);
    assert_int_equal(bytes, 777);
    fd_decode_plan *plan = NULL;
    FD_ASSERT_FAILS(fd_decode_plan_create(&prm, NULL, &plan), b.status, b.message);
    assert_null(plan);
  }
  /* An FP8 kv_dtype on CUDA passes the front end: this build or machine
   * answers for the device (no device, or the kernels' own checks). */
  fd_decode_params prm = good;
  prm.device.type = FD_DEVICE_CUDA;
  int32_t devices = 0;
  FD_ASSERT_OK(fd_cuda_device_count(&devices));
  if (devices == 0) FD_ASSERT_FAILS(fd_decode(&prm), FD_ERR_NO_DEVICE, "");
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_against_dequantised_reference),
      cmocka_unit_test(test_scales_on_bf16_cache),
      cmocka_unit_test(test_other_scales_and_plan),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
