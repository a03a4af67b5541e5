/* FP8 byte comparison shared by the GPU suites that check CUDA's FP8 stores
 * against the CPU's (C++ only; include after cmocka.h). */
#ifndef FD_TEST_FP8_CLOSE_H
#define FD_TEST_FP8_CLOSE_H

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

/* Equal FP8 codes, or neighbours of one sign (one rounding step apart: the
 * device's cos/sin or FP32 rotation may differ from the CPU's by an FP32
 * ulp); a NaN must match exactly. Returns how many were not equal; fails the
 * test on anything farther. */
static inline size_t expect_fp8_close(const std::vector<uint8_t> &got,
                                      const std::vector<uint8_t> &want, const char *what) {
  size_t inexact = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    const bool nan = (got[i] & 0x7f) == 0x7f || (want[i] & 0x7f) == 0x7f;
    if (nan || (got[i] & 0x80) != (want[i] & 0x80) || std::abs(int(got[i]) - int(want[i])) > 1) {
      print_error("%s[%zu]: gpu 0x%02x cpu 0x%02x\n", what, i, got[i], want[i]);
      fail();
    }
    ++inexact;
  }
  return inexact;
}

#endif /* FD_TEST_FP8_CLOSE_H */
