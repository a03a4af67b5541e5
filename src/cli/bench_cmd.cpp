// `flashdec bench`: the CUDA decode benchmark (bench/decode_bench.cu), linked
// into the tool when the CUDA backend and the benchmarks are built. Without
// them the subcommand stays listed but says why it cannot run. The benchmark
// parses its own options: everything after `bench` is handed to it as is.
#include <cstdio>
#include <memory>
#include <vector>

#include "commands.hpp"

#if FLASHDEC_CLI_HAVE_BENCH
#include "decode_bench.hpp"
#endif

CommandRun add_bench_command(CLI::App &root) {
  CLI::App *sub = root.add_subcommand(
      "bench",
      "decode kernel benchmark (CUDA builds, NVIDIA GPU): bench [--out DIR] [--quick] "
      "[--explore] [--filter A,B,...]; 'flashdec bench --help' lists its options");
  sub->set_help_flag();  // --help goes to the benchmark's own parser
  sub->prefix_command();
  return [sub]() -> int {
    std::vector<std::string> rest = sub->remaining();
#if FLASHDEC_CLI_HAVE_BENCH
    // The benchmark parses a whole command line: give it a program name for
    // its usage line, then the arguments after `bench`.
    std::string program = "flashdec bench";
    std::vector<char *> args{program.data()};
    for (std::string &a : rest) args.push_back(a.data());
    args.push_back(nullptr);
    return fd_decode_bench_main(static_cast<int>(args.size()) - 1, args.data());
#else
    (void)rest;
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
  };
}
