// Hand-written SVG charts for the flashdec tools: the workload trace
// (`flashdec workload --svg`) and the benchmark bar charts (bench/). One
// module so that every plot a user sees looks the same: white background,
// the title above the data, axes with units and ticks, a legend.
//
// It decides layout only (margins, ticks, colours are the caller's); it knows
// nothing of FlashDec. Plain C++17, no CUDA header, so .cu files can use it.
// Text is XML-escaped here; callers pass plain strings.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fd_plot {

// A value axis. max <= min means "from the data" (min is kept, usually 0).
struct Axis {
  std::string label;  // with its unit, e.g. "step latency (us)"
  double min = 0;
  double max = 0;
};

// One line (or filled area down to the axis minimum) of a panel.
struct Series {
  std::string name;   // legend text
  std::string color;  // any SVG colour, e.g. "#1f77b4"
  std::vector<double> x, y;
  bool fill = false;        // area instead of line
  bool right_axis = false;  // plotted against Panel::y2
};

// One x/y plot with an optional second y axis (on the right).
struct Panel {
  std::string title;
  Axis x, y, y2;  // y2 is drawn only when some series uses it
  std::vector<Series> series;
};

// Panels stacked vertically under a figure title.
struct Figure {
  std::string title;
  std::string note;  // one line under the title (may be empty)
  int width = 900;
  int panel_height = 260;
  std::vector<Panel> panels;
};

std::string render(const Figure &figure);

// Horizontal bars, one row per bar, coloured by group (with a legend).
struct Bar {
  std::string label;  // shown left of the bar
  double value = 0;
  size_t group = 0;  // index into BarChart::groups
};

struct BarChart {
  std::string title;
  std::string note;                                         // one line under the title
  Axis x;                                                   // value axis (bottom and top)
  std::vector<std::pair<std::string, std::string>> groups;  // legend: name, colour
  std::vector<Bar> bars;
  std::vector<std::pair<double, std::string>> marks;  // dashed reference lines: value, label
  int value_decimals = 2;                             // the number printed after each bar
  int width = 900;
};

std::string render(const BarChart &chart);

// Between about `target` and 2 * `target` round tick values (steps of 1, 2 or
// 5 times a power of ten) covering [lo, hi]; lo and hi are moved outwards to
// ticks when `extend` is set.
std::vector<double> nice_ticks(double *lo, double *hi, int target, bool extend);

// A tick label: no trailing zeros, thousands as "k" / millions as "M".
std::string tick_label(double v);

// The text with &, <, >, " and ' escaped for XML.
std::string escape(std::string_view text);

// Writes `text` to `path`; false (and a message naming the file) on failure.
bool write_file(const std::string &path, const std::string &text, std::string *error);

}  // namespace fd_plot
