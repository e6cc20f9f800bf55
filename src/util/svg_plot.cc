#include "util/svg_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace sieve::svg {

namespace {

// Round tick values from at or below lo to at or above hi, about five of them.
std::vector<double> nice_ticks(double lo, double hi) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / 5;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  const auto first = static_cast<int64_t>(std::floor(lo / step));
  const auto last = static_cast<int64_t>(std::ceil(hi / step - 1e-9));
  for (int64_t i = first; i <= last; ++i) ticks.push_back(static_cast<double>(i) * step);
  return ticks;
}

std::string tick_label(double value) {
  if (value != 0 && (std::fabs(value) >= 1e5 || std::fabs(value) < 1e-2))
    return fmt::format("{:.1e}", value);
  return fmt::format("{:g}", std::round(value * 100) / 100);
}

}  // namespace

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// One panel at (x0, y0). A log2 x axis suits concurrency sweeps (1, 2, 4, ...).
std::string panel(double x0, double y0, const std::string& title, const std::string& x_label,
                  const std::string& y_label, const std::vector<Line>& lines, bool log2_x) {
  double x_lo = INFINITY, x_hi = -INFINITY, y_hi = 0;
  for (const Line& line : lines) {
    for (const auto& [x, y] : line.points) {
      x_lo = std::min(x_lo, x);
      x_hi = std::max(x_hi, x);
      y_hi = std::max(y_hi, y);
    }
  }
  if (!std::isfinite(x_lo)) x_lo = 0, x_hi = 1;
  log2_x = log2_x && x_lo > 0;
  const auto tx = [&](double x) { return log2_x ? std::log2(x) : x; };
  double xa = tx(x_lo), xb = tx(x_hi);
  std::vector<double> x_ticks;
  if (log2_x) {
    xa = std::floor(xa), xb = std::max(std::ceil(xb), xa + 1);
    for (double e = xa; e <= xb; ++e) x_ticks.push_back(e);
  } else {
    xa = std::min(0.0, xa);
    x_ticks = nice_ticks(xa, xb);
    xb = std::max(xb, x_ticks.back());
  }
  std::vector<double> y_ticks = nice_ticks(0, y_hi > 0 ? y_hi : 1);
  const double ya = 0, yb = y_ticks.back();
  const double plot_w = kPanelWidth - kLeft - kRight, plot_h = kPanelHeight - kTop - kBottom;
  const auto px = [&](double x) { return x0 + kLeft + (tx(x) - xa) / (xb - xa) * plot_w; };
  const auto px_raw = [&](double t) { return x0 + kLeft + (t - xa) / (xb - xa) * plot_w; };
  const auto py = [&](double y) { return y0 + kTop + plot_h - (y - ya) / (yb - ya) * plot_h; };

  std::string svg =
      fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="14" text-anchor="middle">{}</text>)"
                  "\n",
                  x0 + kLeft + plot_w / 2, y0 + 22, escape(title));
  svg += fmt::format(
      R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="none" stroke="#444"/>)"
      "\n",
      x0 + kLeft, y0 + kTop, plot_w, plot_h);
  for (double t : x_ticks) {
    const double x = px_raw(t);
    svg +=
        fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}" stroke="#ddd"/>)"
                    "\n",
                    x, y0 + kTop, y0 + kTop + plot_h);
    svg +=
        fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="11" text-anchor="middle">{}</text>)"
                    "\n",
                    x, y0 + kTop + plot_h + 15, tick_label(log2_x ? std::exp2(t) : t));
  }
  for (double t : y_ticks) {
    const double y = py(t);
    svg += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#ddd"/>)"
                       "\n",
                       x0 + kLeft, y, x0 + kLeft + plot_w, y);
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="11" text-anchor="end">{}</text>)"
                       "\n",
                       x0 + kLeft - 5, y + 4, tick_label(t));
  }
  svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="12" text-anchor="middle">{}</text>)"
                     "\n",
                     x0 + kLeft + plot_w / 2, y0 + kPanelHeight - 12, escape(x_label));
  svg += fmt::format(
      R"svg(<text x="{0:.1f}" y="{1:.1f}" font-size="12" text-anchor="middle" transform="rotate(-90 {0:.1f} {1:.1f})">{2}</text>)svg"
      "\n",
      x0 + 16, y0 + kTop + plot_h / 2, escape(y_label));
  for (const Line& line : lines) {
    std::string points;
    for (const auto& [x, y] : line.points) points += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    svg += fmt::format(R"(<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{}/>)"
                       "\n",
                       points, line.colour, line.dashed ? R"( stroke-dasharray="6 4")" : "");
    for (const auto& [x, y] : line.points) {
      svg += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"/>)"
                         "\n",
                         px(x), py(y), line.colour);
    }
  }
  return svg;
}

std::string document_begin(double width, double height, const std::string& title) {
  return fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0:.0f}" height="{1:.0f}" viewBox="0 0 {0:.0f} {1:.0f}" font-family="sans-serif">)"
      "\n"
      R"(<rect width="100%" height="100%" fill="white"/>)"
      "\n"
      R"(<text x="{2:.1f}" y="22" font-size="16" text-anchor="middle">{3}</text>)"
      "\n",
      width, height, width / 2, escape(title));
}

std::string legend_entry(double x, double y, const std::string& colour, const std::string& label) {
  return fmt::format(
      R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-width="3"/>)"
      "\n"
      R"(<text x="{:.1f}" y="{:.1f}" font-size="12">{}</text>)"
      "\n",
      x, y - 4, x + 24, y - 4, colour, x + 32, y, escape(label));
}

}  // namespace sieve::svg
