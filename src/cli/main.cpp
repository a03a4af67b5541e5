// flashdec: command-line front end of libflashdec.
//
// Adding a subcommand: declare its add_*_command in commands.hpp, implement it
// in its own file (options on a CLI11 subcommand, a run function) and add the
// file to CMakeLists.txt and one call below.
#include <unistd.h>

#include <charconv>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "commands.hpp"
#include "flashdec.h"

CLI::Validator writable_file() {
  return CLI::Validator(
      [](std::string &path) -> std::string {
        const bool existed = access(path.c_str(), F_OK) == 0;
        FILE *f = std::fopen(path.c_str(), "a");
        if (f == nullptr) return "cannot write '" + path + "': " + std::strerror(errno);
        std::fclose(f);
        if (!existed) std::remove(path.c_str());
        return std::string();
      },
      "FILE");
}

CLI::Validator whole_number(uint64_t lo, uint64_t hi) {
  const std::string range = std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, range](std::string &s) -> std::string {
        uint64_t v = 0;
        const char *end = s.data() + s.size();
        const auto r = std::from_chars(s.data(), end, v);
        if (s.empty() || r.ec != std::errc() || r.ptr != end || v < lo || v > hi)
          return "'" + s + "' is not a whole number from " + range;
        return std::string();
      },
      "INT in [" + range + "]");
}

bool progress_wanted() {
  return isatty(fileno(stderr)) != 0;
}

int main(int argc, char **argv) {
  CLI::App app{"flashdec: paged KV-cache decode attention library, command-line tools.",
               "flashdec"};
  app.set_version_flag("--version", std::string("flashdec ") + fd_version_string());
  app.require_subcommand(1);
  app.footer(
      "Exit status: 0 success, 1 a failed run (or a missed correctness check), 2 a bad command "
      "line.\nRun 'flashdec COMMAND --help' for a command's options.");
  std::vector<std::pair<CLI::App *, CommandRun>> commands;
  for (auto add : {add_workload_command, add_hostcost_command, add_bench_command}) {
    CommandRun run = add(app);
    commands.emplace_back(app.get_subcommands([](CLI::App *) { return true; }).back(),
                          std::move(run));
  }
  if (argc < 2) {
    std::fprintf(stderr, "%s", app.help().c_str());
    return 2;
  }
  if (argv[1][0] != '-') {
    bool known = false;
    for (auto &c : commands) known = known || c.first->get_name() == argv[1];
    if (!known) {
      std::fprintf(stderr,
                   "flashdec: unknown command '%s' (commands: workload, hostcost, bench; "
                   "flashdec --help)\n",
                   argv[1]);
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp &e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp &e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion &e) {
    return app.exit(e);
  } catch (const CLI::ParseError &e) {
    app.exit(e);  // prints the message and a hint
    return 2;
  }
  for (auto &c : commands)
    if (c.first->parsed()) return c.second();
  return 2;
}
