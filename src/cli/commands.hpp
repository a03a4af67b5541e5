// Subcommands of the flashdec tool. Each takes the arguments after its name
// and returns the process exit code.
#pragma once

int workload_command(int argc, char **argv);
int hostcost_command(int argc, char **argv);
int bench_command(int argc, char **argv);
