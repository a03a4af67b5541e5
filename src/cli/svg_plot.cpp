// Layout of the charts in svg_plot.hpp. Text widths are estimated (no font
// metrics): about 0.6 em per character of the sans-serif font used.
#include "svg_plot.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace fd_plot {
namespace {

constexpr const char *kFont = "DejaVu Sans, Helvetica, Arial, sans-serif";
constexpr double kCharWidth = 0.6;  // em per character, estimated

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string text(double x, double y, std::string_view s, const char *extra = "") {
  return "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\"" + (*extra ? " " : "") + extra + ">" +
         escape(s) + "</text>\n";
}

std::string line(double x1, double y1, double x2, double y2, const char *style) {
  return "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" +
         num(y2) + "\" " + style + "/>\n";
}

std::string header(int width, int height) {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) +
         "\" height=\"" + std::to_string(height) + "\" viewBox=\"0 0 " + std::to_string(width) +
         " " + std::to_string(height) + "\" font-family=\"" + kFont +
         "\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
}

// Figure title and note; returns the height they take.
int titles(std::string *out, const std::string &title, const std::string &note, int x) {
  int y = 8;
  if (!title.empty()) {
    y += 22;
    *out += text(x, y, title, "font-size=\"16\" font-weight=\"bold\"");
  }
  if (!note.empty()) {
    y += 17;
    *out += text(x, y, note, "fill=\"#555\"");
  }
  return y + 8;
}

// Legend entries in a row from (x, y): a swatch then the name.
void legend(std::string *out, double x, double y,
            const std::vector<std::pair<std::string, std::string>> &items,
            const std::vector<bool> &as_line) {
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string &color = items[i].second;
    if (i < as_line.size() && as_line[i]) {
      *out +=
          line(x, y - 4, x + 16, y - 4, ("stroke=\"" + color + "\" stroke-width=\"2\"").c_str());
    } else {
      *out += "<rect x=\"" + num(x) + "\" y=\"" + num(y - 9) +
              "\" width=\"16\" height=\"10\" fill=\"" + color + "\"/>\n";
    }
    *out += text(x + 21, y, items[i].first);
    x += 21 + 11 * kCharWidth * static_cast<double>(items[i].first.size()) + 18;
  }
}

struct Scale {
  double lo, hi, p0, p1;  // data [lo, hi] onto pixels [p0, p1]
  double operator()(double v) const {
    const double t = hi > lo ? (v - lo) / (hi - lo) : 0.0;
    return p0 + (p1 - p0) * std::clamp(t, 0.0, 1.0);
  }
};

// Data range of an axis: its fixed bounds or those of the data.
void axis_range(const Axis &a, double data_lo, double data_hi, double *lo, double *hi) {
  *lo = a.min;
  *hi = a.max > a.min ? a.max : std::max(data_hi, a.min);
  if (a.max <= a.min) *lo = std::min(a.min, data_lo);
  if (!(*hi > *lo)) *hi = *lo + 1;
}

// Points of a series, at most one (the largest y) per pixel column so that
// long traces stay small and their peaks stay visible.
std::vector<std::pair<double, double>> columns(const Series &s, const Scale &sx, const Scale &sy) {
  std::vector<std::pair<double, double>> pts;
  const size_t n = std::min(s.x.size(), s.y.size());
  for (size_t i = 0; i < n; ++i) {
    const double px = std::round(sx(s.x[i]) * 2) / 2, py = sy(s.y[i]);
    if (!pts.empty() && pts.back().first == px) {
      pts.back().second = std::min(pts.back().second, py);  // smaller pixel y = larger value
    } else {
      pts.emplace_back(px, py);
    }
  }
  return pts;
}

void draw_panel(std::string *out, const Panel &p, int width, int top, int height) {
  bool right = false;
  for (const Series &s : p.series) right = right || s.right_axis;
  const double left = 78, plot_r = width - (right ? 78.0 : 30.0);
  *out += text(left, top + 18, p.title, "font-size=\"13\" font-weight=\"bold\"");
  std::vector<std::pair<std::string, std::string>> items;
  std::vector<bool> as_line;
  for (const Series &s : p.series) {
    items.emplace_back(s.name, s.color);
    as_line.push_back(!s.fill);
  }
  legend(out, left, top + 36, items, as_line);
  const double plot_t = top + 48, plot_b = top + height - 46.0;

  // Ranges from the data.
  double xlo = 1e300, xhi = -1e300, ylo[2] = {1e300, 1e300}, yhi[2] = {-1e300, -1e300};
  for (const Series &s : p.series) {
    const int a = s.right_axis ? 1 : 0;
    for (double v : s.x) xlo = std::min(xlo, v), xhi = std::max(xhi, v);
    for (double v : s.y) ylo[a] = std::min(ylo[a], v), yhi[a] = std::max(yhi[a], v);
  }
  if (xlo > xhi) xlo = 0, xhi = 1;
  Scale sx{0, 0, left, plot_r}, sy[2] = {{0, 0, plot_b, plot_t}, {0, 0, plot_b, plot_t}};
  axis_range(p.x, xlo, xhi, &sx.lo, &sx.hi);
  const std::vector<double> xt = nice_ticks(&sx.lo, &sx.hi, 6, false);
  std::vector<double> yt[2];
  for (int a = 0; a < 2; ++a) {
    axis_range(a == 0 ? p.y : p.y2, ylo[a] > yhi[a] ? 0 : ylo[a], ylo[a] > yhi[a] ? 1 : yhi[a],
               &sy[a].lo, &sy[a].hi);
    yt[a] = nice_ticks(&sy[a].lo, &sy[a].hi, 4, (a == 0 ? p.y : p.y2).max <= 0);
  }

  // Grid (left axis), then data, then the frame and ticks on top.
  for (double v : yt[0]) *out += line(left, sy[0](v), plot_r, sy[0](v), "stroke=\"#e5e5e5\"");
  for (const Series &s : p.series) {
    const Scale &y = sy[s.right_axis ? 1 : 0];
    const auto pts = columns(s, sx, y);
    if (pts.empty()) continue;
    std::string d;
    for (size_t i = 0; i < pts.size(); ++i)
      d += (i == 0 ? "M" : " L") + num(pts[i].first) + "," + num(pts[i].second);
    if (s.fill) {
      d = "M" + num(pts.front().first) + "," + num(y(y.lo)) + " L" + d.substr(1) + " L" +
          num(pts.back().first) + "," + num(y(y.lo)) + " Z";
      *out += "<path d=\"" + d + "\" fill=\"" + s.color + "\" fill-opacity=\"0.55\"/>\n";
    } else {
      *out += "<path d=\"" + d + "\" fill=\"none\" stroke=\"" + s.color +
              "\" stroke-width=\"1.2\" stroke-linejoin=\"round\"/>\n";
    }
  }
  *out += "<rect x=\"" + num(left) + "\" y=\"" + num(plot_t) + "\" width=\"" + num(plot_r - left) +
          "\" height=\"" + num(plot_b - plot_t) + "\" fill=\"none\" stroke=\"#333\"/>\n";
  for (double v : xt) {
    *out += line(sx(v), plot_b, sx(v), plot_b + 5, "stroke=\"#333\"");
    *out += text(sx(v), plot_b + 17, tick_label(v), "text-anchor=\"middle\"");
  }
  *out += text((left + plot_r) / 2, plot_b + 35, p.x.label, "text-anchor=\"middle\"");
  for (int a = 0; a < (right ? 2 : 1); ++a) {
    const double x = a == 0 ? left : plot_r, dir = a == 0 ? -1 : 1;
    for (double v : yt[a]) {
      *out += line(x, sy[a](v), x + 5 * dir, sy[a](v), "stroke=\"#333\"");
      *out += text(x + 8 * dir, sy[a](v) + 4, tick_label(v),
                   a == 0 ? "text-anchor=\"end\"" : "text-anchor=\"start\"");
    }
    const double lx = a == 0 ? 16 : width - 10.0, ly = (plot_t + plot_b) / 2;
    const std::string rot =
        "text-anchor=\"middle\" transform=\"rotate(-90 " + num(lx) + " " + num(ly) + ")\"";
    *out += text(lx, ly, (a == 0 ? p.y : p.y2).label, rot.c_str());
  }
}

}  // namespace

std::vector<double> nice_ticks(double *lo, double *hi, int target, bool extend) {
  std::vector<double> t;
  if (!(*hi > *lo) || !std::isfinite(*hi - *lo) || target < 1) {
    t.push_back(*lo);
    return t;
  }
  const double raw = (*hi - *lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  const double first = std::ceil(*lo / step - 1e-9), last = std::floor(*hi / step + 1e-9);
  if (extend) {
    *lo = std::floor(*lo / step + 1e-9) * step;
    *hi = std::ceil(*hi / step - 1e-9) * step;
  }
  const double a = extend ? std::floor(*lo / step + 1e-9) : first;
  const double b = extend ? std::ceil(*hi / step - 1e-9) : last;
  for (double k = a; k <= b + 1e-9; k += 1) {
    const double v = k * step;
    t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  }
  return t;
}

std::string tick_label(double v) {
  const char *suffix = "";
  if (std::fabs(v) >= 1e6) {
    v /= 1e6, suffix = "M";
  } else if (std::fabs(v) >= 1e4) {
    v /= 1e3, suffix = "k";
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return std::string(buf) + suffix;
}

std::string escape(std::string_view s) {
  std::string r;
  r.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': r += "&amp;"; break;
      case '<': r += "&lt;"; break;
      case '>': r += "&gt;"; break;
      case '"': r += "&quot;"; break;
      case '\'': r += "&apos;"; break;
      default: r += c;
    }
  }
  return r;
}

std::string render(const Figure &f) {
  std::string body;
  const int head = titles(&body, f.title, f.note, 78);
  const int height = head + f.panel_height * static_cast<int>(f.panels.size()) + 8;
  for (size_t i = 0; i < f.panels.size(); ++i)
    draw_panel(&body, f.panels[i], f.width, head + f.panel_height * static_cast<int>(i),
               f.panel_height);
  return header(f.width, height) + body + "</svg>\n";
}

std::string render(const BarChart &c) {
  size_t longest = 8;
  for (const Bar &b : c.bars) longest = std::max(longest, b.label.size());
  const double left = 14 + 11 * kCharWidth * static_cast<double>(longest), right = c.width - 60.0;
  const double row = 16;
  std::string body;
  int top = titles(&body, c.title, c.note, 14);
  legend(&body, left, top + 6, c.groups, {});
  top += 20;
  double lo = 0, hi = 0, dlo = 0, dhi = 0;
  for (const Bar &b : c.bars) dlo = std::min(dlo, b.value), dhi = std::max(dhi, b.value);
  for (const auto &m : c.marks) dhi = std::max(dhi, m.first);
  axis_range(c.x, dlo, dhi, &lo, &hi);
  const std::vector<double> ticks = nice_ticks(&lo, &hi, 6, c.x.max <= c.x.min);
  const Scale sx{lo, hi, left, right};
  const double plot_t = top + 18.0;  // room for the reference-line labels
  const double plot_b = plot_t + row * static_cast<double>(c.bars.size()) + 4;
  for (double v : ticks) {
    body += line(sx(v), plot_t, sx(v), plot_b, "stroke=\"#e5e5e5\"");
    body += line(sx(v), plot_b, sx(v), plot_b + 5, "stroke=\"#333\"");
    body += text(sx(v), plot_b + 17, tick_label(v), "text-anchor=\"middle\"");
  }
  for (size_t i = 0; i < c.bars.size(); ++i) {
    const Bar &b = c.bars[i];
    const double y = plot_t + 2 + row * static_cast<double>(i);
    const std::string color = b.group < c.groups.size() ? c.groups[b.group].second : "#888";
    const double x0 = sx(std::max(lo, 0.0)), x1 = sx(b.value);
    body += "<rect x=\"" + num(std::min(x0, x1)) + "\" y=\"" + num(y + 2) + "\" width=\"" +
            num(std::fabs(x1 - x0)) + "\" height=\"" + num(row - 4) + "\" fill=\"" + color +
            "\"/>\n";
    body += text(left - 6, y + row - 4, b.label, "text-anchor=\"end\"");
    char value[48];
    std::snprintf(value, sizeof value, "%.*f", std::clamp(c.value_decimals, 0, 9), b.value);
    body += text(std::max(x0, x1) + 4, y + row - 4, value, "fill=\"#333\"");
  }
  for (const auto &m : c.marks) {
    if (m.first < lo || m.first > hi) continue;
    body += line(sx(m.first), plot_t - 4, sx(m.first), plot_b,
                 "stroke=\"#444\" stroke-dasharray=\"4,3\"");
    body += text(sx(m.first), plot_t - 7, m.second, "text-anchor=\"middle\" font-size=\"10\"");
  }
  body += line(left, plot_t, left, plot_b, "stroke=\"#333\"");
  body += line(left, plot_b, right, plot_b, "stroke=\"#333\"");
  body += text((left + right) / 2, plot_b + 35, c.x.label, "text-anchor=\"middle\"");
  const int height = static_cast<int>(plot_b) + 48;
  return header(c.width, height) + body + "</svg>\n";
}

bool write_file(const std::string &path, const std::string &content, std::string *error) {
  FILE *f = std::fopen(path.c_str(), "wb");
  bool ok = f != nullptr && std::fwrite(content.data(), 1, content.size(), f) == content.size();
  const int err = errno;
  if (f != nullptr && std::fclose(f) != 0) ok = false;
  if (!ok && error != nullptr) *error = path + ": " + std::strerror(err ? err : EIO);
  return ok;
}

}  // namespace fd_plot
