// `flashdec bench`: the CUDA decode benchmark (bench/decode_bench.cu), linked
// into the tool when the CUDA backend and the benchmarks are built. Without
// them the subcommand stays listed but says why it cannot run.
#include <cstdio>
#include <vector>

#include "commands.hpp"

#if FLASHDEC_CLI_HAVE_BENCH
#include "decode_bench.hpp"
#endif

int bench_command(int argc, char **argv) {
#if FLASHDEC_CLI_HAVE_BENCH
  // The benchmark parses a whole command line: give it a program name for
  // its usage line, then the arguments after `bench`.
  char program[] = "flashdec bench";
  std::vector<char *> args{program};
  args.insert(args.end(), argv, argv + argc);
  args.push_back(nullptr);
  return fd_decode_bench_main(argc + 1, args.data());
#else
  (void)argc;
  (void)argv;
#if FLASHDEC_CLI_CUDA
  std::fprintf(stderr,
               "flashdec bench: the decode benchmark was not built (configure with "
               "-DFLASHDEC_BUILD_BENCH=ON)\n");
#else
  std::fprintf(stderr,
               "flashdec bench: this flashdec was built without the CUDA backend; the decode "
               "benchmark needs it and an NVIDIA GPU (configure with -DFLASHDEC_CUDA=ON)\n");
#endif
  return 1;
#endif
}
