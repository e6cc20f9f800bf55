#pragma once
// Summaries of a run: latency percentiles per metric, throughput, goodput under SLOs.
// Latencies are in milliseconds here and in the reports; RequestRecord keeps seconds.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loadgen/client.h"

namespace sieve::loadgen {

// The p-th percentile (0..100) of sorted values, interpolating linearly between closest ranks
// (numpy's default): rank = p/100 * (n - 1). Values must be non-empty and sorted.
double percentile(const std::vector<double>& sorted, double p);

struct Distribution {
  int64_t count = 0;
  double mean = 0, median = 0, p90 = 0, p99 = 0, min = 0, max = 0;
};
Distribution distribution(std::vector<double> values);

// Service-level objectives for goodput; a request is good when it meets every one given.
struct GoodputSlo {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  bool empty() const { return !ttft_ms && !tpot_ms && !e2el_ms; }
};
// Parses "ttft:MS", "tpot:MS", "e2el:MS" items. Throws sieve::Error on anything else.
GoodputSlo parse_goodput(const std::vector<std::string>& items);
bool meets(const RequestRecord& record, const GoodputSlo& slo);

struct RunSummary {
  int64_t completed = 0;
  int64_t failed = 0;
  double duration_s = 0;     // first send to last completion
  int64_t input_tokens = 0;  // the server's prompt_tokens where given, else the workload's count
  int64_t output_tokens = 0;
  double request_throughput = 0;      // completed requests / s
  double output_throughput = 0;       // output tokens / s
  double total_token_throughput = 0;  // (input + output tokens) / s
  Distribution ttft_ms, tpot_ms, itl_ms, e2el_ms;
  std::optional<double> goodput;  // good requests / s, when SLOs were given
  int64_t good_requests = 0;
  int64_t output_shorter = 0;  // completed with fewer tokens than requested
  int64_t output_longer = 0;
  std::map<std::string, int64_t> errors;  // reason -> count
  int max_in_flight = 0;
};

RunSummary summarize(const std::vector<RequestRecord>& records, double duration_s,
                     const GoodputSlo& slo);

}  // namespace sieve::loadgen
