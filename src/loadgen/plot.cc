#include "loadgen/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "util/svg_plot.h"

namespace sieve::loadgen {

namespace {

using svg::kColours;
using svg::kLeft;
using svg::kPanelHeight;
using svg::kPanelWidth;
using svg::Line;

double json_number(const nlohmann::json& j, const char* pointer) {
  const nlohmann::json::json_pointer p(pointer);
  return j.contains(p) && j.at(p).is_number() ? j.at(p).get<double>() : 0.0;
}

}  // namespace

std::vector<PlotSeries> plot_series(const nlohmann::json& report, const std::string& name_prefix) {
  std::map<int, PlotSeries> by_variant;
  for (const nlohmann::json& run : report.at("runs")) {
    const int variant = run.contains("variant") && run["variant"].is_number_integer()
                            ? run["variant"].get<int>()
                            : -1;
    PlotSeries& series = by_variant[variant];
    if (series.name.empty()) {
      const bool has_body =
          run.contains("extra_body") && run["extra_body"].is_object() && !run["extra_body"].empty();
      series.name = name_prefix + (has_body ? run["extra_body"].dump()
                                            : std::string(name_prefix.empty() ? "run" : ""));
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
  std::string svg = svg::document_begin(width, height, title);
  svg += svg::panel(0, 30, "Output throughput vs concurrency", "concurrency", "output tokens/s",
                    lines_of([](const PlotPoint& p) { return p.concurrency; }, throughput, nullptr),
                    true);
  svg += svg::panel(kPanelWidth, 30, "TTFT vs throughput", "output tokens/s", "TTFT (ms)",
                    lines_of(
                        throughput, [](const PlotPoint& p) { return p.ttft_p50_ms; },
                        [](const PlotPoint& p) { return p.ttft_p99_ms; }),
                    false);
  svg += svg::panel(2 * kPanelWidth, 30, "TPOT vs throughput", "output tokens/s", "TPOT (ms)",
                    lines_of(
                        throughput, [](const PlotPoint& p) { return p.tpot_p50_ms; },
                        [](const PlotPoint& p) { return p.tpot_p99_ms; }),
                    false);
  double y = kPanelHeight + 30 + 24;
  svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="12">solid: p50, dashed: p99</text>)"
                     "\n",
                     kLeft, y);
  for (size_t i = 0; i < series.size(); ++i) {
    y += 20;
    svg += svg::legend_entry(kLeft, y, kColours[i % std::size(kColours)], series[i].name);
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace sieve::loadgen
