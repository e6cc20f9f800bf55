#include "loadgen/report.h"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <fstream>
#include <numeric>

#include "util/error.h"

namespace sieve::loadgen {

namespace {

nlohmann::json optional_json(const std::optional<double>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

// Statistics of no values are null, not 0 (e.g. TPOT when every output was one token).
nlohmann::json to_json(const Distribution& d) {
  if (d.count == 0) {
    return {{"count", 0},     {"mean", nullptr}, {"median", nullptr}, {"p90", nullptr},
            {"p99", nullptr}, {"min", nullptr},  {"max", nullptr}};
  }
  return {{"count", d.count}, {"mean", d.mean}, {"median", d.median}, {"p90", d.p90},
          {"p99", d.p99},     {"min", d.min},   {"max", d.max}};
}

double number_at(const nlohmann::json& j, const nlohmann::json::json_pointer& pointer) {
  if (!j.contains(pointer)) return std::nan("");
  const nlohmann::json& v = j.at(pointer);
  return v.is_number() ? v.get<double>() : std::nan("");
}

std::string format_number(double value, int decimals = 2) {
  if (std::isnan(value)) return "-";
  return fmt::format("{:.{}f}", value, decimals);
}

std::string format_ratio(double a, double b) {
  if (std::isnan(a) || std::isnan(b) || a == 0) return "-";
  return fmt::format("{:.2f}x", b / a);
}

}  // namespace

nlohmann::json to_json(const RequestRecord& r, size_t index) {
  nlohmann::json itl = nlohmann::json::array();
  for (double gap : r.itl_s) itl.push_back(gap * 1e3);
  const std::optional<double> tpot = r.tpot_s();
  return {
      {"index", index},
      {"ok", r.ok},
      {"error", r.ok ? nlohmann::json(nullptr) : nlohmann::json(r.error)},
      {"http_status", r.http_status == 0 ? nlohmann::json(nullptr) : nlohmann::json(r.http_status)},
      {"start_ms", r.start_s * 1e3},
      {"ttft_ms", r.ok ? nlohmann::json(r.ttft_s * 1e3) : nlohmann::json(nullptr)},
      {"tpot_ms", tpot ? nlohmann::json(*tpot * 1e3) : nlohmann::json(nullptr)},
      {"e2el_ms", r.e2el_s * 1e3},
      {"itl_ms", itl},
      {"num_chunks", r.num_chunks},
      {"output_tokens", r.output_tokens},
      {"output_tokens_source", to_string(r.output_tokens_source)},
      {"requested_output_tokens", r.requested_output_tokens},
      {"prompt_tokens",
       r.prompt_tokens ? nlohmann::json(*r.prompt_tokens) : nlohmann::json(nullptr)},
      {"input_tokens", r.input_tokens ? nlohmann::json(*r.input_tokens) : nlohmann::json(nullptr)},
      {"cached_tokens",
       r.cached_tokens ? nlohmann::json(*r.cached_tokens) : nlohmann::json(nullptr)},
      {"conversation", r.conversation >= 0 ? nlohmann::json(r.conversation) : nlohmann::json()},
      {"turn", r.turn >= 0 ? nlohmann::json(r.turn) : nlohmann::json()},
      {"finish_reason",
       r.finish_reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.finish_reason)},
      {"generated_text", r.generated_text}};  // e.g. to compare greedy outputs between runs
}

nlohmann::json to_json(const RunSummary& s) {
  std::vector<std::pair<std::string, int64_t>> reasons(s.errors.begin(), s.errors.end());
  std::stable_sort(reasons.begin(), reasons.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  nlohmann::json errors = nlohmann::json::array();  // most frequent first
  for (const auto& [reason, count] : reasons)
    errors.push_back({{"reason", reason}, {"count", count}});
  return {{"completed", s.completed},
          {"failed", s.failed},
          {"duration_s", s.duration_s},
          {"input_tokens", s.input_tokens},
          {"output_tokens", s.output_tokens},
          {"request_throughput", s.request_throughput},
          {"output_throughput", s.output_throughput},
          {"total_token_throughput", s.total_token_throughput},
          {"goodput", optional_json(s.goodput)},
          {"good_requests", s.good_requests},
          {"output_shorter", s.output_shorter},
          {"output_longer", s.output_longer},
          {"max_in_flight", s.max_in_flight},
          {"ttft_ms", to_json(s.ttft_ms)},
          {"tpot_ms", to_json(s.tpot_ms)},
          {"itl_ms", to_json(s.itl_ms)},
          {"e2el_ms", to_json(s.e2el_ms)},
          {"errors", errors}};
}

// Multi-turn runs: per turn index, the completed requests' median and mean TTFT, their mean
// prompt tokens and the share of prompt tokens the server took from its caches.
nlohmann::json turns_json(const std::vector<RequestRecord>& records) {
  std::vector<std::vector<const RequestRecord*>> by_turn;
  for (const RequestRecord& r : records) {
    if (r.turn < 0) continue;
    if (by_turn.size() <= static_cast<size_t>(r.turn))
      by_turn.resize(static_cast<size_t>(r.turn) + 1);
    if (r.ok) by_turn[static_cast<size_t>(r.turn)].push_back(&r);
  }
  nlohmann::json turns = nlohmann::json::array();
  for (size_t t = 0; t < by_turn.size(); ++t) {
    std::vector<double> ttft;
    double prompt = 0, cached = 0;
    for (const RequestRecord* r : by_turn[t]) {
      ttft.push_back(r->ttft_s * 1e3);
      prompt += static_cast<double>(r->prompt_tokens.value_or(0));
      cached += static_cast<double>(r->cached_tokens.value_or(0));
    }
    std::sort(ttft.begin(), ttft.end());
    const auto n = static_cast<double>(ttft.size());
    turns.push_back(
        {{"turn", t},
         {"completed", ttft.size()},
         {"ttft_ms_median", ttft.empty() ? nlohmann::json() : nlohmann::json(percentile(ttft, 50))},
         {"ttft_ms_mean", ttft.empty()
                              ? nlohmann::json()
                              : nlohmann::json(std::accumulate(ttft.begin(), ttft.end(), 0.0) / n)},
         {"prompt_tokens_mean", ttft.empty() ? nlohmann::json() : nlohmann::json(prompt / n)},
         {"cached_share", prompt > 0 ? nlohmann::json(cached / prompt) : nlohmann::json()}});
  }
  return turns;
}

nlohmann::json to_json(const RunResult& run) {
  nlohmann::json requests = nlohmann::json::array();
  for (size_t i = 0; i < run.records.size(); ++i) requests.push_back(to_json(run.records[i], i));
  const RunPoint& p = run.point;
  nlohmann::json turns = turns_json(run.records);
  return {{"label", p.label},
          {"turns", turns.empty() ? nlohmann::json() : turns},
          {"request_rate", optional_json(p.request_rate)},
          {"burstiness", p.burstiness},
          {"max_concurrency",
           p.max_concurrency ? nlohmann::json(*p.max_concurrency) : nlohmann::json(nullptr)},
          {"variant", p.variant ? nlohmann::json(*p.variant) : nlohmann::json(nullptr)},
          {"extra_body", p.extra_body},
          {"summary", to_json(run.summary)},
          {"requests", requests}};
}

nlohmann::json make_report(const nlohmann::json& config, const std::vector<RunResult>& runs) {
  const std::time_t now = std::time(nullptr);
  nlohmann::json out = {{"schema_version", kSchemaVersion},
                        {"tool", "sieve bench-serve"},
                        {"created_at", fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(now))},
                        {"config", config},
                        {"runs", nlohmann::json::array()}};
  for (const RunResult& run : runs) out["runs"].push_back(to_json(run));
  return out;
}

nlohmann::json read_report(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot open '{}'", path);
  nlohmann::json report;
  try {
    report = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail("'{}' is not JSON: {}", path, e.what());
  }
  if (!report.is_object() || !report.contains("schema_version") || !report.contains("runs") ||
      !report["runs"].is_array()) {
    fail("'{}' is not a sieve bench-serve result (no schema_version or runs)", path);
  }
  if (report["schema_version"] != kSchemaVersion) {
    fail("'{}' has schema_version {}, this sieve reads {}", path, report["schema_version"].dump(),
         kSchemaVersion);
  }
  return report;
}

std::string format_errors(const nlohmann::json& errors, const std::string& prefix) {
  constexpr size_t kMaxReasons = 5;
  std::string out;
  for (size_t i = 0; i < errors.size() && i < kMaxReasons; ++i) {
    out += fmt::format("{}failed x{}: {}\n", prefix, errors[i].value("count", 0),
                       errors[i].value("reason", std::string()));
  }
  if (errors.size() > kMaxReasons) {
    out += fmt::format("{}... and {} other reasons (all in the JSON output)\n", prefix,
                       errors.size() - kMaxReasons);
  }
  return out;
}

std::string format_run_details(const nlohmann::json& run) {
  const nlohmann::json& s = run.at("summary");
  using P = nlohmann::json::json_pointer;
  std::string out =
      fmt::format("{:=^60}\n", fmt::format(" {} ", run.value("label", std::string("run"))));
  const auto line = [&](const std::string& name, const std::string& value) {
    out += fmt::format("{:<44}{:>16}\n", name, value);
  };
  line("Successful requests:", fmt::format("{}", s.value("completed", 0)));
  line("Failed requests:", fmt::format("{}", s.value("failed", 0)));
  line("Benchmark duration (s):", format_number(number_at(s, P("/duration_s"))));
  line("Total input tokens:", fmt::format("{}", s.value("input_tokens", 0)));
  line("Total generated tokens:", fmt::format("{}", s.value("output_tokens", 0)));
  line("Request throughput (req/s):", format_number(number_at(s, P("/request_throughput"))));
  line("Output token throughput (tok/s):", format_number(number_at(s, P("/output_throughput"))));
  line("Total token throughput (tok/s):",
       format_number(number_at(s, P("/total_token_throughput"))));
  if (s.contains("goodput") && !s["goodput"].is_null()) {
    line("Request goodput (req/s):", format_number(number_at(s, P("/goodput"))));
  }
  line("Most requests in flight:", fmt::format("{}", s.value("max_in_flight", 0)));
  struct Metric {
    const char* key;
    const char* abbreviation;
    const char* title;
  };
  static constexpr Metric kMetrics[] = {
      {"ttft_ms", "TTFT", "Time to First Token"},
      {"tpot_ms", "TPOT", "Time per Output Token (excl. 1st token)"},
      {"itl_ms", "ITL", "Inter-token Latency"},
      {"e2el_ms", "E2EL", "End-to-end Latency"}};
  static constexpr std::pair<const char*, const char*> kStats[] = {
      {"mean", "Mean"}, {"median", "Median"}, {"p90", "P90"}, {"p99", "P99"}};
  for (const Metric& metric : kMetrics) {
    out += fmt::format("{:-^60}\n", fmt::format(" {} ", metric.title));
    for (const auto& [stat, stat_name] : kStats) {
      line(fmt::format("{} {} (ms):", stat_name, metric.abbreviation),
           format_number(number_at(s, P(fmt::format("/{}/{}", metric.key, stat)))));
    }
  }
  if (run.contains("turns") && run["turns"].is_array()) {
    out += fmt::format("{:-^60}\n", " Multi-turn: per turn ");
    out += fmt::format("{:>6}{:>11}{:>16}{:>14}{:>13}\n", "turn", "completed", "median TTFT ms",
                       "prompt tokens", "cached share");
    for (const nlohmann::json& t : run["turns"]) {
      const auto number = [&](const char* key, int decimals) {
        return t[key].is_number() ? fmt::format("{:.{}f}", t[key].get<double>(), decimals)
                                  : std::string("-");
      };
      out += fmt::format("{:>6}{:>11}{:>16}{:>14}{:>13}\n", t["turn"].get<int64_t>() + 1,
                         t["completed"].get<int64_t>(), number("ttft_ms_median", 1),
                         number("prompt_tokens_mean", 0), number("cached_share", 3));
    }
  }
  const int64_t shorter = s.value("output_shorter", int64_t{0});
  const int64_t longer = s.value("output_longer", int64_t{0});
  if (shorter > 0 || longer > 0) {
    out += fmt::format(
        "warning: {} requests produced fewer and {} more tokens than requested; the server may not "
        "support ignore_eos/min_tokens, so output lengths (and TPOT) are not what was asked for\n",
        shorter, longer);
  }
  if (s.contains("errors")) out += format_errors(s["errors"], "");
  out += fmt::format("{:=^60}\n", "");
  return out;
}

std::string format_sweep_table(const nlohmann::json& report) {
  using P = nlohmann::json::json_pointer;
  std::string out = fmt::format(
      "{:<24} {:>5} {:>6} {:>7} {:>8} {:>10} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8}\n", "point",
      "C", "done", "failed", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
      "ITL p50", "E2EL p50", "goodput");
  for (const nlohmann::json& run : report.at("runs")) {
    const nlohmann::json& s = run.at("summary");
    const std::string concurrency =
        run.contains("max_concurrency") && run["max_concurrency"].is_number()
            ? run["max_concurrency"].dump()
            : "-";
    out += fmt::format(
        "{:<24} {:>5} {:>6} {:>7} {:>8} {:>10} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8}\n",
        run.value("label", std::string()), concurrency, s.value("completed", 0),
        s.value("failed", 0), format_number(number_at(s, P("/request_throughput"))),
        format_number(number_at(s, P("/output_throughput")), 1),
        format_number(number_at(s, P("/ttft_ms/median")), 1),
        format_number(number_at(s, P("/ttft_ms/p99")), 1),
        format_number(number_at(s, P("/tpot_ms/median")), 2),
        format_number(number_at(s, P("/tpot_ms/p99")), 2),
        format_number(number_at(s, P("/itl_ms/median")), 2),
        format_number(number_at(s, P("/e2el_ms/median")), 1),
        format_number(number_at(s, P("/goodput"))));
  }
  out += "(latencies in ms)\n";
  return out;
}

std::string format_comparison(const nlohmann::json& a, const std::string& a_name,
                              const nlohmann::json& b, const std::string& b_name) {
  using P = nlohmann::json::json_pointer;
  const nlohmann::json& runs_a = a.at("runs");
  const nlohmann::json& runs_b = b.at("runs");
  // Pair by label when every label of a appears in b, else by position.
  bool by_label = true;
  for (const nlohmann::json& ra : runs_a) {
    bool found = false;
    for (const nlohmann::json& rb : runs_b)
      found = found || rb.value("label", "") == ra.value("label", "");
    by_label = by_label && found;
  }
  struct Metric {
    const char* key;
    const char* name;
    int decimals;
  };
  static constexpr Metric kMetrics[] = {{"request_throughput", "request throughput (req/s)", 2},
                                        {"output_throughput", "output throughput (tok/s)", 1},
                                        {"goodput", "goodput (req/s)", 2},
                                        {"ttft_ms/mean", "TTFT mean (ms)", 1},
                                        {"ttft_ms/median", "TTFT p50 (ms)", 1},
                                        {"ttft_ms/p99", "TTFT p99 (ms)", 1},
                                        {"tpot_ms/mean", "TPOT mean (ms)", 2},
                                        {"tpot_ms/median", "TPOT p50 (ms)", 2},
                                        {"tpot_ms/p99", "TPOT p99 (ms)", 2},
                                        {"itl_ms/median", "ITL p50 (ms)", 2},
                                        {"itl_ms/p99", "ITL p99 (ms)", 2},
                                        {"e2el_ms/median", "E2EL p50 (ms)", 1},
                                        {"e2el_ms/p99", "E2EL p99 (ms)", 1},
                                        {"completed", "completed requests", 0},
                                        {"failed", "failed requests", 0}};
  std::string out = fmt::format("A: {}\nB: {}\n", a_name, b_name);
  for (size_t i = 0; i < runs_a.size(); ++i) {
    const nlohmann::json& ra = runs_a[i];
    const nlohmann::json* rb = nullptr;
    for (size_t j = 0; j < runs_b.size(); ++j) {
      if (by_label ? runs_b[j].value("label", "") == ra.value("label", "") : j == i)
        rb = &runs_b[j];
    }
    if (rb == nullptr) continue;
    out += fmt::format("\n{:<30} {:>12} {:>12} {:>8}\n",
                       fmt::format("[{}]", ra.value("label", std::string())), "A", "B", "B/A");
    for (const Metric& metric : kMetrics) {
      const P pointer("/summary/" + std::string(metric.key));
      const double va = number_at(ra, pointer), vb = number_at(*rb, pointer);
      out += fmt::format("{:<30} {:>12} {:>12} {:>8}\n", metric.name,
                         format_number(va, metric.decimals), format_number(vb, metric.decimals),
                         format_ratio(va, vb));
    }
  }
  if (runs_b.size() != runs_a.size())
    out += fmt::format("\n(A has {} runs, B has {})\n", runs_a.size(), runs_b.size());
  return out;
}

ProgressDisplay::ProgressDisplay(std::FILE* out, std::string label, int64_t total)
    : out_(out),
      label_(std::move(label)),
      total_(total),
      tty_(::isatty(::fileno(out)) != 0),
      start_(std::chrono::steady_clock::now()) {}

void ProgressDisplay::update(int64_t done, int64_t failed) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double fraction =
      total_ > 0 ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    fmt::print(out_, "\r{} [{}{}] {}/{} failed {} {:.1f}s", label_, std::string(filled, '#'),
               std::string(kWidth - filled, '.'), done, total_, failed, elapsed);
  } else {
    const auto decile = static_cast<int64_t>(fraction * 10);
    if (decile == last_decile_) return;
    last_decile_ = decile;
    fmt::print(out_, "{}: {}/{} done, {} failed, {:.1f}s\n", label_, done, total_, failed, elapsed);
  }
  std::fflush(out_);
}

void ProgressDisplay::finish() {
  if (finished_) return;
  finished_ = true;
  if (tty_) fmt::print(out_, "\n");
  std::fflush(out_);
}

}  // namespace sieve::loadgen
