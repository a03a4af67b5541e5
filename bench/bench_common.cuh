// Helpers shared by the benchmark tools (decode_bench.cu, append_bench.cu):
// fail-fast checks, seeded hashing, order statistics, CUDA-event timing, the
// copy ceiling of docs/benchmarks.md, device setup and report writing.
//
// Header-only (inline) so that each benchmark stays one translation unit and
// CUDA compile time does not grow.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashdec.h"

// A benchmark cannot continue past a failed call: report where and exit 1.
#define CHECK_CUDA(expr)                                                                     \
  do {                                                                                       \
    cudaError_t e_ = (expr);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)
#define CHECK_FD(expr)                                                                         \
  do {                                                                                         \
    fd_status s_ = (expr);                                                                     \
    if (s_ != FD_OK) {                                                                         \
      fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #expr, fd_status_string(s_), \
              fd_last_error_message());                                                        \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

namespace fd_bench {

// ---------------------------------------------------------------------------
// Seeded hashing (splitmix64), usable on the host and on the device.

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// The splitmix64 output function.
__host__ __device__ inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A stateless hash of `z`: the splitmix64 value drawn from state `z`.
inline uint64_t hash64(uint64_t z) {
  return mix64(z + kGolden);
}

// The next splitmix64 value of the generator whose state is `s`.
inline uint64_t splitmix(uint64_t &s) {
  return mix64(s += kGolden);
}

// ---------------------------------------------------------------------------
// Order statistics (the argument is a copy: it gets sorted).

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The element at n / 2 after sorting: for an even count the upper of the two
// middle values. append_bench has always reported this statistic; it keeps it
// so that its numbers compare with earlier runs.
inline double upper_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Nearest-rank percentile, p in [0, 1].
inline double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::lround(p * static_cast<double>(v.size() - 1)));
  return v[i];
}

// ---------------------------------------------------------------------------
// CUDA-event timing on one stream.

class EventTimer {
 public:
  explicit EventTimer(cudaStream_t stream) : stream_(stream) {
    CHECK_CUDA(cudaEventCreate(&start_));
    CHECK_CUDA(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    CHECK_CUDA(cudaEventDestroy(start_));
    CHECK_CUDA(cudaEventDestroy(stop_));
  }
  EventTimer(const EventTimer &) = delete;
  EventTimer &operator=(const EventTimer &) = delete;

  // Milliseconds of GPU time of what `enqueue()` puts on the stream; waits
  // for it to finish.
  template <class Enqueue>
  float time_ms(Enqueue &&enqueue) {
    CHECK_CUDA(cudaEventRecord(start_, stream_));
    enqueue();
    CHECK_CUDA(cudaEventRecord(stop_, stream_));
    CHECK_CUDA(cudaEventSynchronize(stop_));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// ---------------------------------------------------------------------------
// Copy ceiling (docs/benchmarks.md): a device-to-device copy of 1 GiB, counting
// bytes read plus bytes written.

constexpr size_t kCopyBytes = size_t{1} << 30;

// Milliseconds of each of `runs` copies, timed after `warmup` untimed ones.
inline std::vector<double> time_copies_ms(cudaStream_t stream, int warmup, int runs) {
  void *src = nullptr, *dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, kCopyBytes));
  CHECK_CUDA(cudaMalloc(&dst, kCopyBytes));
  CHECK_CUDA(cudaMemsetAsync(src, 1, kCopyBytes, stream));
  std::vector<double> times;
  {
    EventTimer timer(stream);
    for (int i = 0; i < warmup + runs; ++i) {
      const float ms = timer.time_ms([&] {
        CHECK_CUDA(cudaMemcpyAsync(dst, src, kCopyBytes, cudaMemcpyDeviceToDevice, stream));
      });
      if (i >= warmup) times.push_back(ms);
    }
  }
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));
  return times;
}

// GB/s (read + written) of one copy of kCopyBytes that took `ms`.
inline double copy_gbps(double ms) {
  return 2.0 * static_cast<double>(kCopyBytes) / (ms * 1e-3) / 1e9;
}

// ---------------------------------------------------------------------------
// Device setup.

// Device 0 and a non-blocking stream on it. Without a CUDA device it prints
// the visible "SKIPPED" line and returns false (the caller exits with 77, the
// skip code of the test scripts).
// Device 0 and a non-blocking stream; false (after a "SKIPPED" line) when
// there is no usable CUDA device. Uses the CUDA runtime only, so the probes
// that link no flashdec library can share it.
inline bool open_device(cudaDeviceProp *prop, cudaStream_t *stream) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  if (n == 0) {
    printf("SKIPPED: no CUDA device\n");
    return false;
  }
  CHECK_CUDA(cudaGetDeviceProperties(prop, 0));
  CHECK_CUDA(cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking));
  return true;
}

// Parses the options of a benchmark that takes only `--out DIR` (and
// --help, which prints `help`). Returns -1 to go on, else the exit status.
inline int parse_out_only(int argc, char **argv, const char *help, std::string *out_dir) {
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("usage: %s [--out DIR]\n%s", argv[0], help);
      return 0;
    }
    if (!strcmp(argv[i], "--out") && i + 1 < argc) {
      *out_dir = argv[++i];
    } else {
      fprintf(stderr, "usage: %s [--out DIR]\n", argv[0]);
      return 2;
    }
  }
  return -1;
}

// ---------------------------------------------------------------------------
// Reports.

// printf into a std::string.
__attribute__((format(printf, 1, 2))) inline std::string strprintf(const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list again;
  va_copy(again, args);
  const int n = vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  std::string s(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) vsnprintf(&s[0], s.size() + 1, fmt, again);
  va_end(again);
  return s;
}

// The opening of every benchmark's JSON report: the device and the copy
// ceiling of the run, then the benchmark's own fields.
inline std::string json_header(const char *device, double copy_gbps_value) {
  return strprintf("{\n  \"device\": \"%s\",\n  \"copy_GBps\": %.1f,\n", device, copy_gbps_value);
}

// Writes `text` to `path`; a file that cannot be opened is skipped (the
// results were already printed).
inline void write_text(const std::string &path, const std::string &text) {
  FILE *f = fopen(path.c_str(), "w");
  if (!f) return;
  fputs(text.c_str(), f);
  fclose(f);
}

}  // namespace fd_bench
