// Floor benchmark: what limits small and few-CTA decode calls on the GPU.
//
// Standalone (no libflashdec kernels): it times synthetic kernels with the
// protocol of decode_bench.cu, so that its numbers are the floors under the
// decode numbers. Per case: CUDA-graph replays of many launches cycling
// buffers (median of replays / launches, twice), plain stream launches with
// the GPU idle before each (median of 50) and back-to-back stream launches
// (total / launches). Sections:
//   a  one empty kernel per call (256 x 128), without and with PDL
//   b  two empty kernels per call (an attention + merge-like chain)
//   c  a streaming read of N bytes (each CTA one contiguous share, 16-byte
//      loads, 8 in flight per thread) at grids 2 x SMs and 1024, PDL
//   d  the same bytes read as randomly permuted chunks of C KB (each CTA walks
//      a list of chunk ids), against the identity list, 256 CTAs, PDL
//   e  bytes per CTA: B bytes per CTA (grid N / B, CTAs run in waves) against
//      2 x SMs persistent CTAs, PDL
//   f  decode-shaped: a read over 256 CTAs alone and followed by an empty
//      256-CTA kernel, without and with PDL
// PDL kernels execute griddepcontrol.wait, then griddepcontrol.launch_dependents
// (as kernels/decode_kernel.cuh does) and are launched with the programmatic
// stream serialization attribute. Read kernels rotate among buffers whose
// total exceeds 400 MB so that L2 does not hold the data, and are checked: the
// XOR of the per-CTA values must equal the XOR of the words read (computed on
// the host from the seeded fill). The copy ceiling (1 GiB device-to-device,
// bytes read + written) is measured at the start and the end of the run.
//
// Usage: floor_bench [--out DIR]   (writes floor_bench.json, floor_bench.md)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.cuh"

namespace {

using fd_bench::EventTimer;
using fd_bench::median;
using fd_bench::mix64;
using fd_bench::percentile;
using fd_bench::strprintf;

constexpr unsigned kReadThreads = 256;  // threads of a read CTA
constexpr int kUnroll = 8;              // 16-byte loads in flight per thread
constexpr unsigned kEmptyGrid = 256, kEmptyThreads = 128;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kPoolBytes = 512 * kMiB;  // every rotation fits in it
constexpr double kRotationBytes = 400e6;   // buffers of one case exceed this
constexpr unsigned kMaxGrid = 1u << 16;    // per-CTA values

__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

template <bool kPdl>
__global__ void empty_kernel() {
  if (kPdl) {
    pdl_wait();
    pdl_launch_dependents();
  }
}

// Word i of the pool holds the low half of mix64(i): the host can compute
// the XOR of any range.
__global__ void fill_kernel(uint32_t *words, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x)
    words[i] = static_cast<uint32_t>(mix64(i));
}

__device__ __forceinline__ uint4 load_nc(const uint4 *p) {
  return __ldg(p);
}

// XOR of the CTA's `acc` values into out[blockIdx.x].
__device__ __forceinline__ void write_cta_value(uint32_t acc, uint32_t *out) {
  __shared__ uint32_t warp_acc[kReadThreads / 32];
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) warp_acc[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t r = 0;
    for (unsigned w = 0; w < kReadThreads / 32; ++w) r ^= warp_acc[w];
    out[blockIdx.x] = r;
  }
}

// CTA b reads vectors [b * per_cta, min((b + 1) * per_cta, total)) of base.
template <bool kPdl>
__global__ void __launch_bounds__(kReadThreads)
    stream_read_kernel(const uint4 *base, size_t per_cta, size_t total, uint32_t *out) {
  if (kPdl) {
    pdl_wait();
    pdl_launch_dependents();
  }
  const size_t begin = blockIdx.x * per_cta;
  const size_t n = begin >= total ? 0 : (total - begin < per_cta ? total - begin : per_cta);
  const uint4 *p = base + begin;
  uint32_t acc = 0;
  for (size_t i = threadIdx.x; i < n; i += size_t{kReadThreads} * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t idx = i + static_cast<size_t>(u) * kReadThreads;
      v[u] = idx < n ? load_nc(p + idx) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  write_cta_value(acc, out);
}

// CTA b reads the chunks chunks[b * per_cta .. (b + 1) * per_cta), chunk c
// being vectors [c << shift, (c + 1) << shift) of base. The CTA's list is
// staged in shared memory first, so the data loads do not wait on it.
__global__ void __launch_bounds__(kReadThreads)
    paged_read_kernel(const uint4 *base, const uint32_t *chunks, unsigned per_cta, unsigned shift,
                      uint32_t *out) {
  extern __shared__ uint32_t list[];
  pdl_wait();
  pdl_launch_dependents();
  for (unsigned j = threadIdx.x; j < per_cta; j += kReadThreads)
    list[j] = chunks[size_t{blockIdx.x} * per_cta + j];
  __syncthreads();
  const size_t n = size_t{per_cta} << shift;
  const size_t mask = (size_t{1} << shift) - 1;
  uint32_t acc = 0;
  for (size_t i = threadIdx.x; i < n; i += size_t{kReadThreads} * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t idx = i + static_cast<size_t>(u) * kReadThreads;
      v[u] = idx < n ? load_nc(base + ((size_t{list[idx >> shift]} << shift) | (idx & mask)))
                     : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  write_cta_value(acc, out);
}

// Launches `kernel`, with the programmatic stream serialization attribute
// when `pdl` is set.
template <class... Params, class... Args>
void launch(bool pdl, void (*kernel)(Params...), unsigned grid, unsigned threads, size_t smem,
            cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl ? 1 : 0;
  CHECK_CUDA(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
}

// ---------------------------------------------------------------------------
// Timing.

struct Timing {
  int launches = 0;  // launch groups per graph
  double graph_us = 0, p10_us = 0, p90_us = 0, repeat_us = 0;
  double stream_us = 0;  // one group, GPU idle before
  double burst_us = 0;   // back-to-back stream launches, per group
};

// `enqueue(i)` puts launch group i on the stream (it picks buffer i % sets).
template <class Enqueue>
Timing time_group(cudaStream_t stream, int sets, int min_launches, Enqueue &&enqueue) {
  Timing t;
  int launches = std::max(sets, min_launches);
  launches = (launches + sets - 1) / sets * sets;
  t.launches = launches;
  EventTimer timer(stream);
  {
    std::vector<double> v;
    for (int i = 0; i < 60; ++i) {
      CHECK_CUDA(cudaStreamSynchronize(stream));
      const float ms = timer.time_ms([&] { enqueue(i); });
      if (i >= 10) v.push_back(ms * 1e3);
    }
    t.stream_us = median(v);
  }
  {
    std::vector<double> v;
    for (int r = 0; r < 6; ++r) {
      const float ms = timer.time_ms([&] {
        for (int i = 0; i < launches; ++i) enqueue(i);
      });
      if (r > 0) v.push_back(ms * 1e3 / launches);
    }
    t.burst_us = median(v);
  }
  {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < launches; ++i) enqueue(i);
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
    std::vector<double> rounds[2];
    for (int round = 0; round < 2; ++round)
      for (int i = 0; i < 15; ++i) {
        const float ms = timer.time_ms([&] { CHECK_CUDA(cudaGraphLaunch(exec, stream)); });
        rounds[round].push_back(ms * 1e3 / launches);
      }
    t.graph_us = median(rounds[0]);
    t.p10_us = percentile(rounds[0], 0.1);
    t.p90_us = percentile(rounds[0], 0.9);
    t.repeat_us = median(rounds[1]);
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
  }
  return t;
}

// ---------------------------------------------------------------------------
// Cases.

struct Case {
  std::string section, name;
  int kernels = 1;
  bool pdl = true;
  unsigned grid = 0, threads = 0;
  double bytes = 0;          // read per call
  double bytes_per_cta = 0;  // read per CTA (the largest share)
  int sets = 1;              // rotating buffers
  Timing t;
  double gbps = 0, fraction = 0;
  bool ok = true;
};

class Bench {
 public:
  Bench(cudaStream_t stream, int sms) : stream_(stream) {
    CHECK_CUDA(cudaMalloc(&pool_, kPoolBytes));
    CHECK_CUDA(cudaMalloc(&out_, kMaxGrid * sizeof(uint32_t)));
    fill_kernel<<<4 * sms, 256, 0, stream>>>(static_cast<uint32_t *>(pool_), kPoolBytes / 4);
    CHECK_CUDA(cudaGetLastError());
    // Prefix XORs of the fill at every power-of-two size (1 MiB and up).
    uint32_t x = 0;
    for (size_t i = 0; i < kPoolBytes / 4; ++i) {
      x ^= static_cast<uint32_t>(mix64(i));
      const size_t bytes = (i + 1) * 4;
      if (bytes >= kMiB && (bytes & (bytes - 1)) == 0) prefix_xor_.push_back({bytes, x});
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
  }
  ~Bench() {
    CHECK_CUDA(cudaFree(pool_));
    CHECK_CUDA(cudaFree(out_));
  }
  Bench(const Bench &) = delete;
  Bench &operator=(const Bench &) = delete;

  std::vector<Case> cases;

  // a, b: `kernels` empty 256 x 128 kernels per call.
  void empty(const char *section, int kernels, bool pdl) {
    Case c;
    c.section = section;
    c.kernels = kernels;
    c.pdl = pdl;
    c.grid = kEmptyGrid;
    c.threads = kEmptyThreads;
    c.name =
        strprintf("%d empty kernel%s, %s", kernels, kernels > 1 ? "s" : "", pdl ? "PDL" : "no PDL");
    c.t = time_group(stream_, 1, 200, [&](int) {
      for (int k = 0; k < kernels; ++k)
        launch(pdl, pdl ? empty_kernel<true> : empty_kernel<false>, kEmptyGrid, kEmptyThreads, 0,
               stream_);
    });
    finish(c);
  }

  // c, e, f: contiguous shares of `bytes` over `grid` CTAs (share rounded up
  // to 128 bytes), optionally followed by an empty kernel.
  void streaming(const char *section, const std::string &name, size_t bytes, unsigned grid,
                 bool pdl, bool then_empty) {
    Case c;
    c.section = section;
    c.name = name;
    c.kernels = then_empty ? 2 : 1;
    c.pdl = pdl;
    c.grid = grid;
    c.threads = kReadThreads;
    c.bytes = static_cast<double>(bytes);
    const size_t total = bytes / 16;
    const size_t per_cta = ((total + grid - 1) / grid + 7) / 8 * 8;
    c.bytes_per_cta = static_cast<double>(per_cta * 16);
    c.sets = sets_for(bytes);
    auto *kernel = pdl ? stream_read_kernel<true> : stream_read_kernel<false>;
    auto group = [&](int i) {
      const uint4 *base = buffer(bytes, i % c.sets);
      launch(pdl, kernel, grid, kReadThreads, 0, stream_, base, per_cta, total, out_);
      if (then_empty)
        launch(pdl, pdl ? empty_kernel<true> : empty_kernel<false>, kEmptyGrid, kEmptyThreads, 0,
               stream_);
    };
    c.ok = check(group, grid, bytes);
    c.t = time_group(stream_, c.sets, 50, group);
    finish(c);
  }

  // d: `bytes` as chunks of `chunk` bytes in a seeded random order (or the
  // identity order), 256 CTAs.
  void paged(size_t bytes, size_t chunk, bool random) {
    constexpr unsigned kGrid = 256;
    Case c;
    c.section = "d";
    c.name = strprintf("%s, %zu KB chunks, %zu MB", random ? "random" : "sequential", chunk / 1024,
                       bytes / kMiB);
    c.grid = kGrid;
    c.threads = kReadThreads;
    c.bytes = static_cast<double>(bytes);
    c.bytes_per_cta = c.bytes / kGrid;
    c.sets = sets_for(bytes);
    const unsigned n_chunks = static_cast<unsigned>(bytes / chunk);
    const unsigned per_cta = n_chunks / kGrid;
    unsigned shift = 0;
    while ((size_t{16} << shift) < chunk) ++shift;
    std::vector<uint32_t> ids(n_chunks);
    for (unsigned i = 0; i < n_chunks; ++i) ids[i] = i;
    if (random) {
      uint64_t state = 0x5eedf100d0000000ull ^ chunk;
      for (unsigned i = n_chunks - 1; i > 0; --i)
        std::swap(ids[i], ids[fd_bench::splitmix(state) % (i + 1)]);
    }
    uint32_t *table = nullptr;
    CHECK_CUDA(cudaMalloc(&table, ids.size() * sizeof(uint32_t)));
    CHECK_CUDA(
        cudaMemcpy(table, ids.data(), ids.size() * sizeof(uint32_t), cudaMemcpyHostToDevice));
    const size_t smem = per_cta * sizeof(uint32_t);
    auto group = [&](int i) {
      launch(true, paged_read_kernel, kGrid, kReadThreads, smem, stream_, buffer(bytes, i % c.sets),
             table, per_cta, shift, out_);
    };
    c.ok = check(group, kGrid, bytes);
    c.t = time_group(stream_, c.sets, 50, group);
    CHECK_CUDA(cudaFree(table));
    finish(c);
  }

  void set_ceiling(double copy_gbps) {
    for (Case &c : cases) c.fraction = c.bytes > 0 ? c.gbps / copy_gbps : 0;
  }

 private:
  // Buffers of `bytes` whose total exceeds kRotationBytes.
  static int sets_for(size_t bytes) {
    return static_cast<int>(kRotationBytes / static_cast<double>(bytes)) + 1;
  }
  const uint4 *buffer(size_t bytes, int set) const {
    return reinterpret_cast<const uint4 *>(static_cast<const char *>(pool_) + set * bytes);
  }

  // One launch group on buffer 0: the XOR of the per-CTA values must be the
  // XOR of the buffer's words.
  template <class Group>
  bool check(Group &&group, unsigned grid, size_t bytes) {
    CHECK_CUDA(cudaMemsetAsync(out_, 0xff, kMaxGrid * sizeof(uint32_t), stream_));
    group(0);
    std::vector<uint32_t> got(grid);
    CHECK_CUDA(cudaMemcpyAsync(got.data(), out_, grid * sizeof(uint32_t), cudaMemcpyDeviceToHost,
                               stream_));
    CHECK_CUDA(cudaStreamSynchronize(stream_));
    uint32_t x = 0;
    for (uint32_t v : got) x ^= v;
    for (const auto &p : prefix_xor_)
      if (p.first == bytes) return x == p.second;
    return false;
  }

  void finish(Case &c) {
    c.gbps = c.bytes > 0 ? c.bytes / (c.t.graph_us * 1e-6) / 1e9 : 0;
    printf("%s  %-44s grid %5u  %9.2f us (rep %9.2f, stream %8.2f, burst %8.2f)", c.section.c_str(),
           c.name.c_str(), c.grid, c.t.graph_us, c.t.repeat_us, c.t.stream_us, c.t.burst_us);
    if (c.bytes > 0) printf("  %6.0f GB/s", c.gbps);
    printf("%s\n", c.ok ? "" : "  CHECK FAILED");
    fflush(stdout);
    cases.push_back(c);
  }

  cudaStream_t stream_;
  void *pool_ = nullptr;
  uint32_t *out_ = nullptr;
  std::vector<std::pair<size_t, uint32_t>> prefix_xor_;
};

// ---------------------------------------------------------------------------
// Reports.

const Case *find(const std::vector<Case> &cases, const char *section, const std::string &name) {
  for (const Case &c : cases)
    if (c.section == section && c.name == name) return &c;
  return nullptr;
}

// The fastest graph time of the read cases of `bytes` (any section).
double fastest_read_us(const std::vector<Case> &cases, double bytes, std::string *which) {
  double best = 0;
  for (const Case &c : cases)
    if (c.kernels == 1 && c.bytes == bytes && (best == 0 || c.t.graph_us < best)) {
      best = c.t.graph_us;
      *which = c.section + ": " + c.name + strprintf(", grid %u", c.grid);
    }
  return best;
}

std::string summarize(const std::vector<Case> &cases) {
  std::string s;
  auto line = [&](const char *label, const Case *c) {
    if (c)
      s += strprintf("- %s: %.2f us per call under graph replay (stream %.2f us, burst %.2f us)\n",
                     label, c->t.graph_us, c->t.stream_us, c->t.burst_us);
  };
  line("1 empty kernel, no PDL", find(cases, "a", "1 empty kernel, no PDL"));
  line("1 empty kernel, PDL", find(cases, "a", "1 empty kernel, PDL"));
  line("2 empty kernels, no PDL", find(cases, "b", "2 empty kernels, no PDL"));
  line("2 empty kernels, PDL", find(cases, "b", "2 empty kernels, PDL"));
  for (double mb : {2.0, 8.0, 32.0}) {
    std::string which;
    const double us = fastest_read_us(cases, mb * kMiB, &which);
    if (us > 0)
      s += strprintf("- fastest read of %.1f MB: %.2f us (%s)\n", mb * kMiB / 1e6, us,
                     which.c_str());
  }
  double best = 0;
  for (const Case &c : cases) best = std::max(best, c.fraction);
  s += strprintf("- best read bandwidth: %.3f of the copy ceiling\n", best);
  int failed = 0;
  for (const Case &c : cases) failed += c.ok ? 0 : 1;
  s += strprintf("- read checks failed: %d\n", failed);
  return s;
}

void write_json(const std::string &path, const std::vector<Case> &cases, const char *device,
                int sms, double copy0, double copy1, double copy) {
  std::string s = fd_bench::json_header(device, copy);
  s += strprintf(
      "  \"sm_count\": %d,\n  \"copy_GBps_start\": %.1f,\n  \"copy_GBps_end\": %.1f,\n"
      "  \"read_threads\": %u,\n  \"loads_in_flight_per_thread\": %d,\n  \"cases\": [\n",
      sms, copy0, copy1, kReadThreads, kUnroll);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case &c = cases[i];
    s += strprintf(
        "    {\"section\": \"%s\", \"name\": \"%s\", \"kernels\": %d, \"pdl\": %s, \"grid\": %u, "
        "\"threads\": %u, \"MB\": %.3f, \"KB_per_cta\": %.2f, \"buffer_sets\": %d, "
        "\"launches_per_graph\": %d, \"graph_median_us\": %.3f, \"p10_us\": %.3f, "
        "\"p90_us\": %.3f, \"repeat_median_us\": %.3f, \"stream_median_us\": %.3f, "
        "\"burst_us\": %.3f, \"GBps\": %.1f, \"fraction\": %.3f, \"ok\": %s}%s\n",
        c.section.c_str(), c.name.c_str(), c.kernels, c.pdl ? "true" : "false", c.grid, c.threads,
        c.bytes / 1e6, c.bytes_per_cta / 1024, c.sets, c.t.launches, c.t.graph_us, c.t.p10_us,
        c.t.p90_us, c.t.repeat_us, c.t.stream_us, c.t.burst_us, c.gbps, c.fraction,
        c.ok ? "true" : "false", i + 1 < cases.size() ? "," : "");
  }
  s += "  ]\n}\n";
  fd_bench::write_text(path, s);
}

void write_markdown(const std::string &path, const std::vector<Case> &cases, const char *device,
                    int sms, double copy0, double copy1, double copy, const std::string &summary) {
  std::string s = strprintf(
      "# floor_bench: %s, %d SMs\n\n"
      "Copy ceiling (1 GiB D2D, read + written): %.0f GB/s (start %.0f, end %.0f). "
      "Read kernels: %u threads, %d 16-byte loads in flight per thread. Times are per call "
      "(launch group); graph = median of 15 replays / launches per replay; stream = one call "
      "with the GPU idle before (median of 50); burst = back-to-back stream launches. GB/s = "
      "bytes read / graph time; fraction = GB/s / copy ceiling.\n\n%s\n",
      device, sms, copy, copy0, copy1, kReadThreads, kUnroll, summary.c_str());
  const char *titles[][2] = {
      {"a", "One empty kernel per call (256 x 128)"},
      {"b", "Two empty kernels per call (attention + merge-like chain)"},
      {"c", "Streaming read, contiguous share per CTA, PDL"},
      {"d", "Paged read: permuted chunks, 256 CTAs, PDL"},
      {"e", "Bytes per CTA (grid = N / B) vs persistent CTAs, PDL"},
      {"f", "Decode-shaped: read over 256 CTAs, alone and + empty merge-like kernel"},
  };
  for (const auto &t : titles) {
    s += strprintf(
        "## %s. %s\n\n"
        "| case | kernels | PDL | grid | MB | KB/CTA | sets | graph us | p10 | p90 | repeat | "
        "stream us | burst us | GB/s | fraction | ok |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        t[0], t[1]);
    for (const Case &c : cases) {
      if (c.section != t[0]) continue;
      s += strprintf(
          "| %s | %d | %s | %u | %.1f | %.1f | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | "
          "%.0f | %.3f | %s |\n",
          c.name.c_str(), c.kernels, c.pdl ? "yes" : "no", c.grid, c.bytes / 1e6,
          c.bytes_per_cta / 1024, c.sets, c.t.graph_us, c.t.p10_us, c.t.p90_us, c.t.repeat_us,
          c.t.stream_us, c.t.burst_us, c.gbps, c.fraction, c.ok ? "yes" : "NO");
    }
    s += "\n";
  }
  fd_bench::write_text(path, s);
}

double measure_copy_gbps(cudaStream_t stream) {
  return fd_bench::copy_gbps(median(fd_bench::time_copies_ms(stream, 3, 10)));
}

}  // namespace

int main(int argc, char **argv) {
  std::string out_dir = ".";
  const int parsed = fd_bench::parse_out_only(
      argc, argv,
      "Measures launch and memory floors on CUDA device 0 (empty kernels with and\n"
      "without PDL, streaming and paged reads, bytes per CTA) and writes\n"
      "floor_bench.json and floor_bench.md to DIR (default .).\n"
      "Exit status: 0 all read checks passed, 1 a failed check or CUDA call,\n"
      "2 bad arguments, 77 no CUDA device.\n",
      &out_dir);
  if (parsed >= 0) return parsed;
  cudaDeviceProp prop;
  cudaStream_t stream;
  if (!fd_bench::open_device(&prop, &stream)) return 77;
  const int sms = prop.multiProcessorCount;
  int resident = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, stream_read_kernel<true>,
                                                           kReadThreads, 0));
  const double copy0 = measure_copy_gbps(stream);
  printf("device %s, %d SMs, L2 %d MB; copy ceiling %.0f GB/s; read CTAs resident per SM: %d\n",
         prop.name, sms, prop.l2CacheSize >> 20, copy0, resident);

  std::vector<Case> cases;
  {
    Bench b(stream, sms);
    b.empty("a", 1, false);
    b.empty("a", 1, true);
    b.empty("b", 2, false);
    b.empty("b", 2, true);
    const unsigned persistent = 2u * static_cast<unsigned>(sms);
    for (unsigned grid : {persistent, 1024u})
      for (size_t mb : {2, 8, 32, 128, 512})
        b.streaming("c", strprintf("%zu MiB (%.1f MB)", mb, mb * kMiB / 1e6), mb * kMiB, grid, true,
                    false);
    for (size_t kb : {4, 8, 32, 128})
      for (bool random : {true, false}) b.paged(256 * kMiB, kb * 1024, random);
    for (size_t kb : {16, 32, 64, 256, 1024}) {
      const unsigned grid = static_cast<unsigned>(256 * kMiB / (kb * 1024));
      b.streaming("e", strprintf("%zu KB per CTA, 256 MiB", kb), 256 * kMiB, grid, true, false);
    }
    b.streaming("e", "persistent, 256 MiB", 256 * kMiB, persistent, true, false);
    for (size_t mb : {2, 8, 32})
      for (bool pdl : {false, true})
        for (bool merge : {false, true}) {
          if (!pdl && mb != 8) continue;
          b.streaming(
              "f",
              strprintf("read %zu MiB%s, %s", mb, merge ? " + empty" : "", pdl ? "PDL" : "no PDL"),
              mb * kMiB, 256, pdl, merge);
        }
    const double copy1 = measure_copy_gbps(stream);
    const double copy = std::max(copy0, copy1);
    b.set_ceiling(copy);
    cases = b.cases;
    printf("copy ceiling: %.0f GB/s at start, %.0f GB/s at end; using %.0f\n", copy0, copy1, copy);
    const std::string summary = summarize(cases);
    printf("\n%s", summary.c_str());
    write_json(out_dir + "/floor_bench.json", cases, prop.name, sms, copy0, copy1, copy);
    write_markdown(out_dir + "/floor_bench.md", cases, prop.name, sms, copy0, copy1, copy, summary);
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  for (const Case &c : cases)
    if (!c.ok) return 1;
  return 0;
}
