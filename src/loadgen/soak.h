#pragma once
// A soak of an OpenAI-compatible server (`sieve soak`): many streaming clients for minutes,
// normal greedy requests of every kind mixed with hostile ones, and a check that nothing was
// lost. Not a benchmark: it counts outcomes and compares texts.
//
//   references: each distinct greedy request of the catalogue, served alone, in order; then
//                each conversation's next turn twice: cold (after POST /reset_prefix_cache) and
//                right after its first turn (continuing the first turn's parked compressed state,
//                or its prefix-cache pages with `full`)
//   load, until the deadline:
//     num_clients threads, each request drawn from
//       normal       a catalogue request (completions or chat, n > 1, logprobs, stop strings, a
//                    kv_policy); a completed one must equal its reference text, every choice
//       conversation a catalogue request, then its next turn (the prompt and answer resent with a
//                    new question): the first must equal its reference; the next one its
//                    continued reference if the server says it continued as many tokens
//                    (usage.kv_cache.continued_tokens), its cold one if it continued none
//       disconnect   a normal request closed after 1..24 text chunks           (abuse only)
//       cancel       a normal request closed before or right after its first chunk (abuse only)
//       malformed    invalid JSON, wrong types, a too-short Content-Length, garbage bytes, a
//                    body cut short by a half-close                             (abuse only)
//     num_slow_readers threads reading their streams at 100 bytes/s               (abuse only)
//     num_slow_loris sockets sending headers with Content-Length: 100000, then a byte every
//                    few seconds, reopened when the server closes one           (abuse only)
//     one /health probe every 500 ms
//   settle: /metrics until no request runs or waits; then the KV pages still in use
//
// A failure (SoakReport::failures) is a normal request that got a 5xx, a broken connection or
// stream, or no answer in time; a greedy text differing from its reference; KV pages in use
// after the settle; or a server that stopped answering. 429 and 503 under load are outcomes the
// server may choose (it is telling clients to back off), counted but not failures.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loadgen/workload.h"

namespace sieve::loadgen {

struct SoakConfig {
  std::string base_url;
  std::string api_key;  // sent as "Authorization: Bearer" when set
  double duration_s = 60;
  int num_clients = 64;
  bool abuse = true;
  int num_slow_loris = 32;
  int num_slow_readers = 4;
  double slow_loris_interval_s = 3;  // between two bytes of one slow-loris body
  int slow_reader_bytes_per_s = 100;
  uint64_t seed = 0;
  double request_timeout_s = 120;  // a normal request not finished by then fails
  double settle_timeout_s = 60;    // waiting for the server to finish after the load
};

// One distinct greedy request of the normal clients.
struct SoakRequest {
  ApiEndpoint endpoint = ApiEndpoint::kCompletions;
  std::string prompt;
  int32_t max_tokens = 32;
  int32_t n = 1;
  bool logprobs = false;
  std::vector<std::string> stop;
  std::string kv_policy;  // as the JSON "kv_policy" string
  // A next turn: the earlier prompt and its answer come before `prompt` (chat: user and
  // assistant messages; completions: the three texts concatenated).
  struct EarlierTurn {
    std::string prompt;
    std::string answer;
  };
  std::optional<EarlierTurn> earlier;

  nlohmann::json body() const;  // streaming, temperature 0, usage included
  std::string label() const;    // e.g. "chat n=2 logprobs snapkv:B=32,W=16"
};

// What the served model's `kv_policy` may name: /v1/models' "sieve" object.
struct ModelShape {
  int64_t num_layers = 3;
  int64_t num_kv_heads = 2;
};

// The catalogue: every kv_policy sieve serves without a calibration profile, each on both
// endpoints, with n = 2, logprobs and stop strings spread across them; the per-layer and per-head
// compositions name layers and KV heads the model has. Sized for a model with a context of 512
// tokens or more.
std::vector<SoakRequest> soak_catalogue(const ModelShape& shape);

// The next turn of catalogue request `first` (n = 1) once it answered `answer`; n = 2 and logprobs
// on some of them (`k`: the conversation's number, which spreads them).
SoakRequest next_turn(const SoakRequest& first, std::string answer, size_t k);

struct LatencySummary {
  int64_t count = 0;
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
};
LatencySummary summarize_latency(std::vector<double> values_ms);

struct SoakReport {
  // kind ("normal", "disconnect", "cancel", "malformed", "slow reader", "slow-loris", "health")
  // -> outcome -> count.
  std::map<std::string, std::map<std::string, int64_t>> outcomes;
  int64_t num_references = 0;
  LatencySummary normal_ttft;  // normal requests that produced text, from connect to first text
  LatencySummary health;       // /health probes answered 200
  int64_t health_failures = 0;
  LatencySummary slow_loris_held;  // from opening to the server's close, of those it closed
  int64_t greedy_checked = 0;      // completed normal requests compared with their reference
  // Conversations: references whose next turn continued (of num_conversations); next turns under
  // load compared with their continued and cold references, and those that continued from some
  // other point (not compared).
  int64_t num_conversations = 0;
  int64_t conversation_references_continued = 0;
  int64_t next_turns_continued = 0;
  int64_t next_turns_cold = 0;
  int64_t next_turns_elsewhere = 0;
  int64_t greedy_mismatches = 0;
  std::vector<std::string> mismatch_examples;  // a few, for the report
  int64_t normal_failures = 0;
  std::optional<int64_t> kv_pages_used_after;  // sieve:kv_pages_used after the settle
  std::optional<int64_t> requests_running_after;
  std::optional<int64_t> requests_waiting_after;
  double load_seconds = 0;

  std::vector<std::string> failures() const;  // empty when the soak passed
};

// Runs the soak against config.base_url. Throws sieve::Error when the server cannot be reached
// or a reference request fails (nothing can be compared then).
SoakReport run_soak(const SoakConfig& config);

std::string format_soak_report(const SoakConfig& config, const SoakReport& report);
nlohmann::json soak_report_json(const SoakConfig& config, const SoakReport& report);

}  // namespace sieve::loadgen
