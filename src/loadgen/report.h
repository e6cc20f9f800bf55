#pragma once
// What a run leaves behind: a JSON document with every request (kSchemaVersion), tables for the
// terminal, a progress display on stderr, and a side-by-side comparison of two JSON files.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "loadgen/runner.h"

namespace sieve::loadgen {

// Bumped when a key is renamed or removed (adding keys keeps the version).
//   {"schema_version": 1, "tool", "created_at", "config": {the command's options},
//    "runs": [{"label", "request_rate", "burstiness", "max_concurrency", "variant", "extra_body",
//              "summary": {"completed", "failed", "duration_s", "input_tokens", "output_tokens",
//                          "request_throughput", "output_throughput", "total_token_throughput",
//                          "goodput", "good_requests", "output_shorter", "output_longer",
//                          "max_in_flight", "errors": [{"reason", "count"}],
//                          "ttft_ms" | "tpot_ms" | "itl_ms" | "e2el_ms":
//                              {"count", "mean", "median", "p90", "p99", "min", "max"}},
//              "requests": [{"index", "ok", "error", "http_status", "start_ms", "ttft_ms",
//                            "tpot_ms", "e2el_ms", "itl_ms": [...], "num_chunks", "output_tokens",
//                            "output_tokens_source", "requested_output_tokens", "prompt_tokens",
//                            "input_tokens", "finish_reason", "generated_text"}]}]}
// Missing values are null (e.g. TPOT of a one-token output, statistics of no values).
inline constexpr int kSchemaVersion = 1;

nlohmann::json to_json(const RequestRecord& record, size_t index);
nlohmann::json to_json(const RunSummary& summary);
nlohmann::json to_json(const RunResult& run);
// {"schema_version", "tool", "created_at", "config", "runs": [...]}; config is the caller's.
nlohmann::json make_report(const nlohmann::json& config, const std::vector<RunResult>& runs);

// Reads a report written by make_report. Throws sieve::Error on a missing file, bad JSON or an
// unknown schema version.
nlohmann::json read_report(const std::string& path);

// The terminal tables, from report JSON so that --compare can reuse them.
std::string format_run_details(const nlohmann::json& run);
// "failed xN: reason" lines of a summary's errors, the five most frequent.
std::string format_errors(const nlohmann::json& errors, const std::string& prefix);
std::string format_sweep_table(const nlohmann::json& report);
// Runs are paired by label (else by position); ratios are b / a.
std::string format_comparison(const nlohmann::json& a, const std::string& a_name,
                              const nlohmann::json& b, const std::string& b_name);

// A bar redrawn in place on a terminal; on a pipe or file, a plain line every 10%.
class ProgressDisplay {
 public:
  ProgressDisplay(std::FILE* out, std::string label, int64_t total);
  void update(int64_t done, int64_t failed);
  void finish();

 private:
  std::FILE* out_;
  std::string label_;
  int64_t total_;
  bool tty_;
  int64_t last_decile_ = -1;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace sieve::loadgen
