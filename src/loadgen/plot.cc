#include "loadgen/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

namespace sieve::loadgen {

namespace {

constexpr double kPanelWidth = 380, kPanelHeight = 300;
constexpr double kLeft = 64, kRight = 16, kTop = 40, kBottom = 48;  // margins inside a panel
constexpr const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

double json_number(const nlohmann::json& j, const char* pointer) {
  const nlohmann::json::json_pointer p(pointer);
  return j.contains(p) && j.at(p).is_number() ? j.at(p).get<double>() : 0.0;
}

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

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
  if (value != 0 && (std::fabs(value) >= 1e5 || std::fabs(value) < 1e-2)) return fmt::format("{:.1e}", value);
  return fmt::format("{:g}", std::round(value * 100) / 100);
}

struct Line {
  std::string colour;
  bool dashed = false;
  std::vector<std::pair<double, double>> points;
};

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

  std::string svg = fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="14" text-anchor="middle">{}</text>)""\n",
                                x0 + kLeft + plot_w / 2, y0 + 22, escape(title));
  svg += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="none" stroke="#444"/>)""\n",
                     x0 + kLeft, y0 + kTop, plot_w, plot_h);
  for (double t : x_ticks) {
    const double x = px_raw(t);
    svg += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}" stroke="#ddd"/>)""\n", x,
                       y0 + kTop, y0 + kTop + plot_h);
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="11" text-anchor="middle">{}</text>)""\n", x,
                       y0 + kTop + plot_h + 15, tick_label(log2_x ? std::exp2(t) : t));
  }
  for (double t : y_ticks) {
    const double y = py(t);
    svg += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#ddd"/>)""\n", x0 + kLeft, y,
                       x0 + kLeft + plot_w, y);
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="11" text-anchor="end">{}</text>)""\n",
                       x0 + kLeft - 5, y + 4, tick_label(t));
  }
  svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="12" text-anchor="middle">{}</text>)""\n",
                     x0 + kLeft + plot_w / 2, y0 + kPanelHeight - 12, escape(x_label));
  svg += fmt::format(
      R"svg(<text x="{0:.1f}" y="{1:.1f}" font-size="12" text-anchor="middle" transform="rotate(-90 {0:.1f} {1:.1f})">{2}</text>)svg""\n",
      x0 + 16, y0 + kTop + plot_h / 2, escape(y_label));
  for (const Line& line : lines) {
    std::string points;
    for (const auto& [x, y] : line.points) points += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    svg += fmt::format(R"(<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{}/>)""\n", points,
                       line.colour, line.dashed ? R"( stroke-dasharray="6 4")" : "");
    for (const auto& [x, y] : line.points) {
      svg += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"/>)""\n", px(x), py(y), line.colour);
    }
  }
  return svg;
}

}  // namespace

std::vector<PlotSeries> plot_series(const nlohmann::json& report, const std::string& name_prefix) {
  std::map<int, PlotSeries> by_variant;
  for (const nlohmann::json& run : report.at("runs")) {
    const int variant = run.contains("variant") && run["variant"].is_number_integer() ? run["variant"].get<int>() : -1;
    PlotSeries& series = by_variant[variant];
    if (series.name.empty()) {
      const bool has_body = run.contains("extra_body") && run["extra_body"].is_object() && !run["extra_body"].empty();
      series.name = name_prefix + (has_body ? run["extra_body"].dump() : std::string(name_prefix.empty() ? "run" : ""));
    }
    PlotPoint p;
    p.concurrency = run.contains("max_concurrency") && run["max_concurrency"].is_number()
                        ? run["max_concurrency"].get<double>()
                        : json_number(run, "/summary/max_in_flight");
    p.output_throughput = json_number(run, "/summary/output_throughput");
    p.ttft_p50_ms = json_number(run, "/summary/ttft_ms/median");
    p.ttft_p99_ms = json_number(run, "/summary/ttft_ms/p99");
    p.tpot_p50_ms = json_number(run, "/summary/tpot_ms/median");
    p.tpot_p99_ms = json_number(run, "/summary/tpot_ms/p99");
    series.points.push_back(p);
  }
  std::vector<PlotSeries> out;
  for (auto& [variant, series] : by_variant) {
    std::sort(series.points.begin(), series.points.end(),
              [](const PlotPoint& a, const PlotPoint& b) { return a.concurrency < b.concurrency; });
    out.push_back(std::move(series));
  }
  return out;
}

std::string render_svg(const std::vector<PlotSeries>& series, const std::string& title) {
  const auto lines_of = [&](const std::function<double(const PlotPoint&)>& x,
                            const std::function<double(const PlotPoint&)>& y50,
                            const std::function<double(const PlotPoint&)>& y99) {
    std::vector<Line> lines;
    for (size_t i = 0; i < series.size(); ++i) {
      const std::string colour = kColours[i % std::size(kColours)];
      Line p50{colour, false, {}}, p99{colour, true, {}};
      for (const PlotPoint& p : series[i].points) {
        p50.points.emplace_back(x(p), y50(p));
        if (y99) p99.points.emplace_back(x(p), y99(p));
      }
      lines.push_back(std::move(p50));
      if (y99) lines.push_back(std::move(p99));
    }
    return lines;
  };
  const auto throughput = [](const PlotPoint& p) { return p.output_throughput; };
  const double legend_height = 20.0 * static_cast<double>(series.size()) + 24;
  const double width = 3 * kPanelWidth, height = kPanelHeight + 36 + legend_height;
  std::string svg = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0:.0f}" height="{1:.0f}" viewBox="0 0 {0:.0f} {1:.0f}" font-family="sans-serif">)""\n"
      R"(<rect width="100%" height="100%" fill="white"/>)""\n"
      R"(<text x="{2:.1f}" y="22" font-size="16" text-anchor="middle">{3}</text>)""\n",
      width, height, width / 2, escape(title));
  svg += panel(0, 30, "Output throughput vs concurrency", "concurrency", "output tokens/s",
               lines_of([](const PlotPoint& p) { return p.concurrency; }, throughput, nullptr), true);
  svg += panel(kPanelWidth, 30, "TTFT vs throughput", "output tokens/s", "TTFT (ms)",
               lines_of(throughput, [](const PlotPoint& p) { return p.ttft_p50_ms; },
                        [](const PlotPoint& p) { return p.ttft_p99_ms; }),
               false);
  svg += panel(2 * kPanelWidth, 30, "TPOT vs throughput", "output tokens/s", "TPOT (ms)",
               lines_of(throughput, [](const PlotPoint& p) { return p.tpot_p50_ms; },
                        [](const PlotPoint& p) { return p.tpot_p99_ms; }),
               false);
  double y = kPanelHeight + 30 + 24;
  svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="12">solid: p50, dashed: p99</text>)""\n", kLeft, y);
  for (size_t i = 0; i < series.size(); ++i) {
    y += 20;
    const std::string colour = kColours[i % std::size(kColours)];
    svg += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-width="3"/>)""\n",
                       kLeft, y - 4, kLeft + 24, y - 4, colour);
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="12">{}</text>)""\n", kLeft + 32, y,
                       escape(series[i].name));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace sieve::loadgen
