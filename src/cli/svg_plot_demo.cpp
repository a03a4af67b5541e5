// Test program for svg_plot: draws a benchmark-style bar chart (fake decode
// results, with a reference line per target) and a two-axis line figure
// (fake workload trace), both with labels that need XML escaping, to the
// files named on the command line. check_outputs.cmake parses and renders
// them; the decode benchmark's real chart needs a GPU.
#include <cmath>
#include <cstdio>
#include <string>

#include "svg_plot.hpp"

int main(int argc, char **argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: svg_plot_demo BARS.svg LINES.svg\n");
    return 2;
  }
  fd_plot::BarChart bars;
  bars.title = "fake decode results <A & B> \"quoted\"";
  bars.note = "synthetic data for the plot test";
  bars.x = {"effective bandwidth / copy bandwidth (fraction)", 0, 1.2};
  bars.groups = {{"KV < 16 MB", "#9bb7d4"}, {">= 0.9 of copy", "#2e7d32"}, {"< 0.9", "#ef6c00"}};
  bars.marks = {{0.6, "0.6 floor"}, {0.9, "0.9 target"}, {1.0, "copy"}};
  for (int i = 0; i < 12; ++i) {
    const double v = 0.3 + 0.07 * i;
    bars.bars.push_back(
        {"A 8x8192 bf16 bs" + std::to_string(16 << (i % 2)) + " #" + std::to_string(i), v,
         i < 3 ? 0u : (v >= 0.9 ? 1u : 2u)});
  }
  fd_plot::Figure fig;
  fig.title = "fake trace <latency & blocks>";
  fd_plot::Panel p;
  p.title = "case 'x' / policy \"y\"";
  p.x.label = "iteration (step number)";
  p.y.label = "step latency (us)";
  p.y2.label = "KV blocks in use";
  p.y2.max = 64;
  fd_plot::Series blocks{"blocks (right axis)", "#6baed6", {}, {}, true, true};
  fd_plot::Series lat{"latency (left axis)", "#d62728", {}, {}, false, false};
  for (int i = 0; i < 5000; ++i) {  // more points than pixels: columns are merged
    blocks.x.push_back(i);
    blocks.y.push_back(32 + 30 * std::sin(i / 400.0));
    lat.x.push_back(i);
    lat.y.push_back(5 + (i % 977 == 0 ? 40 : std::fmod(i * 0.37, 3.0)));
  }
  p.series = {blocks, lat};
  fig.panels = {p, p};
  std::string error;
  if (!fd_plot::write_file(argv[1], fd_plot::render(bars), &error) ||
      !fd_plot::write_file(argv[2], fd_plot::render(fig), &error)) {
    std::fprintf(stderr, "svg_plot_demo: %s\n", error.c_str());
    return 1;
  }
  return 0;
}
