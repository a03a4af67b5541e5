// Entry point of the decode benchmark (decode_bench.cu), shared by the
// standalone `decode_bench` executable and the `flashdec bench` subcommand.
// Plain C++ (no CUDA header) so that host-only code can call it.
#pragma once

// Runs the benchmark as a program would: argv[0] is the name shown in the
// usage line, the rest are its options (see `--help`). Returns the exit
// status; a failed CUDA or FlashDec call ends the process with status 1.
int fd_decode_bench_main(int argc, char **argv);
