// Subcommands of the flashdec tool. Each registers its options on the root
// CLI11 app and returns the function that runs it once the command line has
// parsed (its exit status). Parse errors exit with status 2 in main.cpp.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

using CommandRun = std::function<int()>;

CommandRun add_workload_command(CLI::App &root);
CommandRun add_hostcost_command(CLI::App &root);
CommandRun add_bench_command(CLI::App &root);

// A validator for output-file options: the file can be opened for writing
// (checked when the command line is parsed, before any work; a file that did
// not exist is not left behind).
CLI::Validator writable_file();

// A validator for integer options: the text is a decimal whole number in
// [lo, hi] (no sign, no overflow), checked before CLI11 converts it.
CLI::Validator whole_number(uint64_t lo, uint64_t hi);

// True when progress should be drawn: stderr is a terminal.
bool progress_wanted();
