#pragma once
// An SVG of sweep results, written by hand: output throughput vs concurrency, and TTFT and TPOT
// (p50 solid, p99 dashed) vs output throughput, one colour per series.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace sieve::loadgen {

struct PlotPoint {
  double concurrency = 0;  // the limit, or the most requests seen in flight without one
  double output_throughput = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  double tpot_p50_ms = 0, tpot_p99_ms = 0;
};

struct PlotSeries {
  std::string name;
  std::vector<PlotPoint> points;
};

// One series per --extra-body variant of a report (one series when there is none).
std::vector<PlotSeries> plot_series(const nlohmann::json& report,
                                    const std::string& name_prefix = "");

std::string render_svg(const std::vector<PlotSeries>& series, const std::string& title);

}  // namespace sieve::loadgen
