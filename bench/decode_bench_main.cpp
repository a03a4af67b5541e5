// The standalone decode benchmark; the work is in decode_bench.cu.
#include "decode_bench.hpp"

int main(int argc, char **argv) {
  return fd_decode_bench_main(argc, argv);
}
