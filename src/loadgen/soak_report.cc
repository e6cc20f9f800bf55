// The soak's report (loadgen/soak.h): latency summaries, what counts as a failure, the text and
// JSON a run prints.
#include <fmt/format.h>

#include <algorithm>

#include "loadgen/client.h"
#include "loadgen/metrics.h"
#include "loadgen/soak.h"

namespace sieve::loadgen {

LatencySummary summarize_latency(std::vector<double> values_ms) {
  LatencySummary out;
  if (values_ms.empty()) return out;
  std::sort(values_ms.begin(), values_ms.end());
  out.count = static_cast<int64_t>(values_ms.size());
  out.p50_ms = percentile(values_ms, 50);
  out.p99_ms = percentile(values_ms, 99);
  out.max_ms = values_ms.back();
  return out;
}

std::vector<std::string> SoakReport::failures() const {
  std::vector<std::string> out;
  if (normal_failures > 0)
    out.push_back(
        fmt::format("{} normal request(s) failed (5xx, broken connection or stream, "
                    "timeout)",
                    normal_failures));
  if (greedy_mismatches > 0)
    out.push_back(fmt::format("{} greedy request(s) differ from their reference (served alone)",
                              greedy_mismatches));
  if (!kv_pages_used_after) {
    out.push_back("/metrics did not answer after the run (is the server alive?)");
  } else if (*kv_pages_used_after != 0) {
    out.push_back(fmt::format("{} KV page(s) still in use after the run", *kv_pages_used_after));
  }
  return out;
}

std::string format_soak_report(const SoakConfig& config, const SoakReport& report) {
  std::string out = fmt::format("soak of {}: {:.0f} s of load ({:g} s asked), {} clients, abuse {}",
                                config.base_url, report.load_seconds, config.duration_s,
                                config.num_clients, config.abuse ? "on" : "off");
  if (config.abuse) {
    out += fmt::format(" ({} slow-loris connections, {} slow readers)", config.num_slow_loris,
                       config.num_slow_readers);
  }
  out += fmt::format(", seed {}\n", config.seed);
  out += fmt::format("references: {} distinct greedy requests, each served alone first\n",
                     report.num_references);
  out += fmt::format(
      "           {} next turns, each cold and after its first turn ({} continued its parked "
      "state)\n\n",
      report.num_conversations, report.conversation_references_continued);
  out += "outcomes\n";
  for (const auto& [kind, outcomes] : report.outcomes) {
    bool first = true;
    for (const auto& [outcome, count] : outcomes) {
      out += fmt::format("  {:<12} {:<64} {:>7}\n", first ? kind : "", excerpt(outcome, 64), count);
      first = false;
    }
  }
  const LatencySummary& t = report.normal_ttft;
  out += fmt::format("\nnormal TTFT: p50 {:.1f} ms, p99 {:.1f} ms, max {:.1f} ms ({} requests)\n",
                     t.p50_ms, t.p99_ms, t.max_ms, t.count);
  const LatencySummary& h = report.health;
  out += fmt::format("/health: p50 {:.1f} ms, p99 {:.1f} ms, max {:.1f} ms; {} of {} failed\n",
                     h.p50_ms, h.p99_ms, h.max_ms, report.health_failures,
                     h.count + report.health_failures);
  if (report.slow_loris_held.count > 0) {
    const LatencySummary& l = report.slow_loris_held;
    out += fmt::format(
        "slow-loris connections the server closed: after {:.1f} s (p50), {:.1f} s "
        "(max)\n",
        l.p50_ms / 1e3, l.max_ms / 1e3);
  }
  out += fmt::format("greedy: {} completed requests compared with their references, {} differ\n",
                     report.greedy_checked, report.greedy_mismatches);
  for (const std::string& example : report.mismatch_examples) out += "  " + example + "\n";
  out += fmt::format(
      "next turns: {} continued a parked state and {} ran cold, compared with those references; "
      "{} continued another state (not compared)\n",
      report.next_turns_continued, report.next_turns_cold, report.next_turns_elsewhere);
  const auto show = [](const std::optional<int64_t>& v) {
    return v ? std::to_string(*v) : std::string("?");
  };
  out += fmt::format("after the run: {} KV pages in use, {} requests running, {} waiting\n",
                     show(report.kv_pages_used_after), show(report.requests_running_after),
                     show(report.requests_waiting_after));
  const std::vector<std::string> failures = report.failures();
  out += failures.empty() ? "result: PASS\n" : "result: FAIL\n";
  for (const std::string& f : failures) out += "  " + f + "\n";
  return out;
}

nlohmann::json soak_report_json(const SoakConfig& config, const SoakReport& report) {
  const auto latency = [](const LatencySummary& l) {
    return nlohmann::json{
        {"count", l.count}, {"p50_ms", l.p50_ms}, {"p99_ms", l.p99_ms}, {"max_ms", l.max_ms}};
  };
  const auto optional = [](const std::optional<int64_t>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  return {
      {"config",
       {{"base_url", config.base_url},
        {"duration_s", config.duration_s},
        {"clients", config.num_clients},
        {"abuse", config.abuse},
        {"slow_loris", config.num_slow_loris},
        {"slow_readers", config.num_slow_readers},
        {"seed", config.seed}}},
      {"load_seconds", report.load_seconds},
      {"references", report.num_references},
      {"outcomes", report.outcomes},
      {"normal_ttft", latency(report.normal_ttft)},
      {"health", latency(report.health)},
      {"health_failures", report.health_failures},
      {"slow_loris_held", latency(report.slow_loris_held)},
      {"conversations",
       {{"references", report.num_conversations},
        {"references_continued", report.conversation_references_continued},
        {"next_turns_continued", report.next_turns_continued},
        {"next_turns_cold", report.next_turns_cold},
        {"next_turns_elsewhere", report.next_turns_elsewhere}}},
      {"greedy_checked", report.greedy_checked},
      {"greedy_mismatches", report.greedy_mismatches},
      {"mismatch_examples", report.mismatch_examples},
      {"normal_failures", report.normal_failures},
      {"kv_pages_used_after", optional(report.kv_pages_used_after)},
      {"requests_running_after", optional(report.requests_running_after)},
      {"requests_waiting_after", optional(report.requests_waiting_after)},
      {"failures", report.failures()},
      {"passed", report.failures().empty()},
  };
}

}  // namespace sieve::loadgen
