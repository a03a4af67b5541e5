// flashdec: command-line front end of libflashdec.
//
// Adding a subcommand: declare it in commands.hpp, implement it in its own
// file, add the file to CMakeLists.txt and one row to kCommands below.
#include <cstdio>
#include <cstring>

#include "commands.hpp"
#include "flashdec.h"

namespace {

struct Command {
  const char *name;
  int (*run)(int, char **);
  const char *help;
};

const Command kCommands[] = {
    {"workload", workload_command,
     "workload synthetic|scheduler|integrated [--case NAME] [--seed N] [--threads N] "
     "[--json FILE] [--svg FILE]"},
    {"hostcost", hostcost_command, "hostcost [--iterations N]: host-side costs (no GPU)"},
    {"bench", bench_command,
     "bench [--out DIR] [--quick] [--explore] [--filter A,B,...]: decode kernel benchmark "
     "(CUDA builds, NVIDIA GPU; bench --help)"},
};

void usage() {
  std::fprintf(stderr, "flashdec %s\nusage:\n", fd_version_string());
  for (const Command &c : kCommands) std::fprintf(stderr, "  flashdec %s\n", c.help);
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  for (const Command &c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) return c.run(argc - 2, argv + 2);
  }
  std::fprintf(stderr, "flashdec: unknown command '%s'\n", argv[1]);
  usage();
  return 2;
}
