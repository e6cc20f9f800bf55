#include "loadgen/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "util/error.h"

namespace sieve::loadgen {

double percentile(const std::vector<double>& sorted, double p) {
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto below = static_cast<size_t>(std::floor(rank));
  const size_t above = std::min(below + 1, sorted.size() - 1);
  const double fraction = rank - static_cast<double>(below);
  return sorted[below] + fraction * (sorted[above] - sorted[below]);
}

Distribution distribution(std::vector<double> values) {
  Distribution d;
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  d.count = static_cast<int64_t>(values.size());
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  d.median = percentile(values, 50);
  d.p90 = percentile(values, 90);
  d.p99 = percentile(values, 99);
  d.min = values.front();
  d.max = values.back();
  return d;
}

GoodputSlo parse_goodput(const std::vector<std::string>& items) {
  GoodputSlo slo;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    const std::string name = item.substr(0, colon);
    double value = 0;
    bool parsed = false;
    if (colon != std::string::npos) {
      try {
        size_t used = 0;
        value = std::stod(item.substr(colon + 1), &used);
        parsed = used == item.size() - colon - 1;
      } catch (const std::exception&) {
      }
    }
    if (!parsed || !(value > 0))
      fail("bad --goodput item '{}': expected NAME:MS with a positive MS", item);
    if (name == "ttft") {
      slo.ttft_ms = value;
    } else if (name == "tpot") {
      slo.tpot_ms = value;
    } else if (name == "e2el") {
      slo.e2el_ms = value;
    } else {
      fail("bad --goodput item '{}': the metric must be ttft, tpot or e2el", item);
    }
  }
  return slo;
}

bool meets(const RequestRecord& record, const GoodputSlo& slo) {
  if (!record.ok) return false;
  if (slo.ttft_ms && record.ttft_s * 1e3 > *slo.ttft_ms) return false;
  if (slo.e2el_ms && record.e2el_s * 1e3 > *slo.e2el_ms) return false;
  // A single-token output has no TPOT, and so cannot miss a TPOT target.
  if (slo.tpot_ms && record.tpot_s() && *record.tpot_s() * 1e3 > *slo.tpot_ms) return false;
  return true;
}

RunSummary summarize(const std::vector<RequestRecord>& records, double duration_s,
                     const GoodputSlo& slo) {
  RunSummary s;
  s.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2el;
  for (const RequestRecord& r : records) {
    if (!r.ok) {
      ++s.failed;
      ++s.errors[r.error];
      continue;
    }
    ++s.completed;
    s.input_tokens += r.prompt_tokens.value_or(r.input_tokens.value_or(0));
    s.output_tokens += r.output_tokens;
    if (r.output_tokens < r.requested_output_tokens) ++s.output_shorter;
    if (r.output_tokens > r.requested_output_tokens) ++s.output_longer;
    ttft.push_back(r.ttft_s * 1e3);
    e2el.push_back(r.e2el_s * 1e3);
    if (const std::optional<double> t = r.tpot_s()) tpot.push_back(*t * 1e3);
    for (double gap : r.itl_s) itl.push_back(gap * 1e3);
    if (!slo.empty() && meets(r, slo)) ++s.good_requests;
  }
  s.ttft_ms = distribution(std::move(ttft));
  s.tpot_ms = distribution(std::move(tpot));
  s.itl_ms = distribution(std::move(itl));
  s.e2el_ms = distribution(std::move(e2el));
  if (duration_s > 0) {
    s.request_throughput = static_cast<double>(s.completed) / duration_s;
    s.output_throughput = static_cast<double>(s.output_tokens) / duration_s;
    s.total_token_throughput = static_cast<double>(s.input_tokens + s.output_tokens) / duration_s;
    if (!slo.empty()) s.goodput = static_cast<double>(s.good_requests) / duration_s;
  }
  return s;
}

}  // namespace sieve::loadgen
