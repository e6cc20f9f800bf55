#include "loadgen/soak.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <random>
#include <thread>

#include "loadgen/client.h"
#include "loadgen/metrics.h"
#include "loadgen/raw_http.h"
#include "loadgen/sse.h"
#include "util/error.h"

namespace sieve::loadgen {

namespace {

using std::chrono::duration;
using Seconds = duration<double>;

constexpr size_t kMaxMismatchExamples = 5;

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(Seconds(seconds));
}

double ms_since(Clock::time_point start) {
  return duration<double, std::milli>(Clock::now() - start).count();
}

// What the threads of one soak share. Counters and samples are under `mutex`.
struct SoakState {
  const SoakConfig& config;
  ServerUrl url;
  std::vector<SoakRequest> catalogue;
  std::vector<std::vector<std::string>> references;  // [catalogue idx][choice idx] text
  // A catalogue request (n = 1) and its next turn, with the next turn's two references.
  struct Conversation {
    size_t first = 0;  // catalogue idx
    SoakRequest next;
    std::vector<std::string> cold;       // served after POST /reset_prefix_cache
    std::vector<std::string> continued;  // served right after the first turn
    int64_t continued_tokens = 0;        // what that one continued (0: nothing parked)
  };
  std::vector<Conversation> conversations;
  Clock::time_point deadline;
  std::atomic<bool> load_done{false};

  std::mutex mutex;
  SoakReport report;
  std::vector<double> ttft_ms;
  std::vector<double> health_ms;
  std::vector<double> slow_loris_held_ms;

  void count(const std::string& kind, const std::string& outcome) {
    std::lock_guard lock(mutex);
    ++report.outcomes[kind][outcome];
  }
  std::vector<std::string> headers(bool json_body) const {
    std::vector<std::string> h;
    if (json_body) h.push_back("Content-Type: application/json");
    if (!config.api_key.empty()) h.push_back("Authorization: Bearer " + config.api_key);
    return h;
  }
};

// Sleeps until `until` or the deadline, whichever comes first.
void sleep_until_or(Clock::time_point until, Clock::time_point deadline) {
  std::this_thread::sleep_until(std::min(until, deadline));
}

// How a streaming request is cut short on purpose (all unset: read it to the end).
struct StreamPlan {
  bool close_before_head = false;
  bool close_after_head = false;
  std::optional<int64_t> close_after_chunks;  // text chunks
};

struct StreamResult {
  std::string outcome;
  bool failed = false;     // counts as a failure of a normal request
  bool completed = false;  // read to [DONE]
  std::optional<double> ttft_ms;
  std::vector<std::string> texts;  // [choice idx]
  bool logprobs_seen = false;
  // usage.kv_cache.continued_tokens (sieve's): prompt tokens taken over from a parked state.
  std::optional<int64_t> continued_tokens;
};

// The status outcome of an answer other than 200; 429 and 503 are the server asking clients to
// back off under load, not failures.
StreamResult status_result(int status, std::string_view body) {
  StreamResult r;
  r.outcome = fmt::format("http {}", status);
  r.failed = status != 429 && status != 503;
  if (r.failed) r.outcome += ": " + excerpt(body, 80);
  return r;
}

// Applies one SSE event to the result; false on a server error in the stream.
bool take_event(const std::string& data, ApiEndpoint endpoint, StreamResult& r, int64_t& num_chunks,
                Clock::time_point start, bool& done) {
  if (data == "[DONE]") {
    done = true;
    return true;
  }
  nlohmann::json chunk;
  try {
    chunk = nlohmann::json::parse(data);
  } catch (const nlohmann::json::exception&) {
    r.outcome = "malformed stream chunk";
    return false;
  }
  if (!chunk.is_object() || chunk.contains("error")) {
    r.outcome = "error in stream: " + excerpt(data, 80);
    return false;
  }
  if (chunk.contains("usage") && chunk["usage"].is_object()) {
    const nlohmann::json& usage = chunk["usage"];
    if (usage.contains("kv_cache") && usage["kv_cache"].is_object() &&
        usage["kv_cache"].contains("continued_tokens") &&
        usage["kv_cache"]["continued_tokens"].is_number_integer())
      r.continued_tokens = usage["kv_cache"]["continued_tokens"].get<int64_t>();
  }
  if (!chunk.contains("choices") || !chunk["choices"].is_array()) return true;
  for (const nlohmann::json& choice : chunk["choices"]) {
    if (!choice.is_object()) continue;
    const size_t idx = choice.value("index", 0);
    if (idx >= r.texts.size()) {
      r.outcome = fmt::format("choice index {} beyond n", idx);
      return false;
    }
    std::string text;
    if (endpoint == ApiEndpoint::kChat) {
      if (choice.contains("delta") && choice["delta"].is_object() &&
          choice["delta"].contains("content") && choice["delta"]["content"].is_string())
        text = choice["delta"]["content"].get<std::string>();
    } else if (choice.contains("text") && choice["text"].is_string()) {
      text = choice["text"].get<std::string>();
    }
    if (choice.contains("logprobs") && !choice["logprobs"].is_null()) r.logprobs_seen = true;
    if (text.empty()) continue;
    if (!r.ttft_ms) r.ttft_ms = ms_since(start);
    r.texts[idx] += text;
    ++num_chunks;
  }
  return true;
}

// One streaming request on a fresh connection, read as `plan` says.
StreamResult stream_request(const SoakState& s, const SoakRequest& request,
                            const StreamPlan& plan) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = after(s.config.request_timeout_s);
  auto opened = RawConnection::open(s.url, std::min(deadline, after(30)));
  if (auto* reason = std::get_if<std::string>(&opened))
    return {.outcome = "connect failed: " + *reason, .failed = true};
  RawConnection& connection = *std::get<0>(opened);
  const std::string path = s.url.path_prefix + endpoint_path(request.endpoint);
  std::vector<std::string> headers = s.headers(true);
  headers.push_back("Accept: text/event-stream");
  if (auto error = connection.send(
          http_request("POST", path, s.url, request.body().dump(), headers), deadline))
    return {.outcome = "send failed: " + *error, .failed = true};
  if (plan.close_before_head) return {.outcome = "closed before the response"};

  auto head_or_error = connection.read_head(deadline);
  if (auto* reason = std::get_if<std::string>(&head_or_error))
    return {.outcome = "no response: " + *reason, .failed = true};
  const ResponseHead& head = std::get<ResponseHead>(head_or_error);
  if (head.status != 200) {
    std::string body;
    for (BodyRead read;
         (read = connection.read_body(16384, after(5))).status == BodyRead::Status::kData &&
         body.size() < 4096;)
      body += read.bytes;
    return status_result(head.status, body);
  }
  if (plan.close_after_head) return {.outcome = "closed after the response head"};

  StreamResult r;
  r.texts.resize(static_cast<size_t>(request.n));
  SseParser parser;
  int64_t num_chunks = 0;
  bool done = false;
  for (;;) {
    BodyRead read = connection.read_body(16384, deadline);
    switch (read.status) {
      case BodyRead::Status::kData:
        for (const std::string& data : parser.feed(read.bytes)) {
          if (!take_event(data, request.endpoint, r, num_chunks, start, done)) {
            r.failed = true;
            return r;
          }
          if (plan.close_after_chunks && num_chunks >= *plan.close_after_chunks) {
            r.outcome = "closed mid-stream";
            return r;
          }
        }
        continue;
      case BodyRead::Status::kEnd:
        for (const std::string& data : parser.finish())
          take_event(data, request.endpoint, r, num_chunks, start, done);
        r.completed = done;
        r.failed = !done;
        r.outcome = done ? "completed" : "stream ended without [DONE]";
        return r;
      case BodyRead::Status::kTimeout:
        r.outcome = fmt::format("no end of stream in {:g} s", s.config.request_timeout_s);
        r.failed = true;
        return r;
      case BodyRead::Status::kClosed:
      case BodyRead::Status::kError:
        r.outcome = "stream broken: " + read.error;
        r.failed = true;
        return r;
    }
  }
}

// A normal request of `kind` served under load, counted; with logprobs asked for, a completed one
// without them fails.
StreamResult serve_normal(SoakState& s, const SoakRequest& request, const std::string& kind) {
  StreamResult r = stream_request(s, request, {});
  if (r.completed && request.logprobs && !r.logprobs_seen) {
    r.outcome = "completed without the logprobs asked for";
    r.failed = true;
  }
  std::lock_guard lock(s.mutex);
  ++s.report.outcomes[kind][r.outcome];
  if (r.failed) ++s.report.normal_failures;
  if (r.ttft_ms) s.ttft_ms.push_back(*r.ttft_ms);
  return r;
}

// Compares a completed greedy request's texts with its reference; under s.mutex.
bool check_greedy(SoakState& s, const std::string& label, const std::vector<std::string>& want,
                  const std::vector<std::string>& got) {
  ++s.report.greedy_checked;
  if (got == want) return true;
  ++s.report.greedy_mismatches;
  if (s.report.mismatch_examples.size() >= kMaxMismatchExamples) return false;
  size_t choice = 0;
  while (choice + 1 < got.size() && choice + 1 < want.size() && got[choice] == want[choice])
    ++choice;
  s.report.mismatch_examples.push_back(
      fmt::format("{} (choice {}): reference '{}', under load '{}'", label, choice,
                  excerpt(choice < want.size() ? want[choice] : "", 100),
                  excerpt(choice < got.size() ? got[choice] : "", 100)));
  return false;
}

void run_normal(SoakState& s, std::mt19937_64& rng) {
  const size_t idx = std::uniform_int_distribution<size_t>(0, s.catalogue.size() - 1)(rng);
  const SoakRequest& request = s.catalogue[idx];
  const StreamResult r = serve_normal(s, request, "normal");
  if (!r.completed) return;
  std::lock_guard lock(s.mutex);
  check_greedy(s, request.label(), s.references[idx], r.texts);
}

// A first turn and, when it answered as alone, its next turn: compared with the reference of
// the state it continued from, as the server reports it.
void run_conversation(SoakState& s, std::mt19937_64& rng) {
  const SoakState::Conversation& c =
      s.conversations[std::uniform_int_distribution<size_t>(0, s.conversations.size() - 1)(rng)];
  const SoakRequest& first = s.catalogue[c.first];
  const StreamResult r1 = serve_normal(s, first, "conversation");
  if (!r1.completed) return;
  {
    std::lock_guard lock(s.mutex);
    if (!check_greedy(s, first.label(), s.references[c.first], r1.texts)) return;
  }
  const StreamResult r2 = serve_normal(s, c.next, "conversation");
  if (!r2.completed) return;
  std::lock_guard lock(s.mutex);
  const int64_t continued = r2.continued_tokens.value_or(0);
  if (continued > 0 && continued == c.continued_tokens) {
    ++s.report.next_turns_continued;
    check_greedy(s, c.next.label() + ", continued", c.continued, r2.texts);
  } else if (continued == 0) {
    ++s.report.next_turns_cold;
    check_greedy(s, c.next.label() + ", cold", c.cold, r2.texts);
  } else {
    ++s.report.next_turns_elsewhere;
  }
}

void run_disconnect(SoakState& s, std::mt19937_64& rng) {
  const SoakRequest& request =
      s.catalogue[std::uniform_int_distribution<size_t>(0, s.catalogue.size() - 1)(rng)];
  const int64_t chunks = std::uniform_int_distribution<int64_t>(1, 24)(rng);
  const StreamResult r = stream_request(s, request, {.close_after_chunks = chunks});
  s.count("disconnect", r.completed ? "finished before its close point" : r.outcome);
}

void run_cancel(SoakState& s, std::mt19937_64& rng) {
  const SoakRequest& request =
      s.catalogue[std::uniform_int_distribution<size_t>(0, s.catalogue.size() - 1)(rng)];
  StreamPlan plan;
  switch (std::uniform_int_distribution<int>(0, 2)(rng)) {
    case 0:
      plan.close_before_head = true;
      break;
    case 1:
      plan.close_after_head = true;
      break;
    default:
      plan.close_after_chunks = 1;
  }
  const StreamResult r = stream_request(s, request, plan);
  s.count("cancel", r.outcome == "closed mid-stream" ? "closed after the first chunk"
                    : r.completed                    ? "finished before it was cancelled"
                                                     : r.outcome);
}

// Requests the server must refuse (4xx) or close, never crash on.
void run_malformed(SoakState& s, std::mt19937_64& rng) {
  static const std::vector<std::pair<ApiEndpoint, std::string>> kWrongTypes = {
      {ApiEndpoint::kCompletions, R"({"prompt": 42, "max_tokens": 8})"},
      {ApiEndpoint::kCompletions, R"({"prompt": "Once", "max_tokens": "many"})"},
      {ApiEndpoint::kCompletions, R"({"prompt": "Once", "n": "two", "max_tokens": 4})"},
      {ApiEndpoint::kCompletions, R"({"prompt": "Once", "kv_policy": "snapkv:B=-1"})"},
      {ApiEndpoint::kCompletions, R"({"prompt": "Once", "stream": "yes"})"},
      {ApiEndpoint::kCompletions, R"({"prompt": "Once", "temperature": [1]})"},
      {ApiEndpoint::kCompletions, R"({"prompt": "Once", "stop": [1, 2]})"},
      {ApiEndpoint::kCompletions, R"([1, 2, 3])"},
      {ApiEndpoint::kChat, R"({"messages": "hello"})"},
      {ApiEndpoint::kChat, R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": 1.5})"},
      {ApiEndpoint::kChat, R"({"messages": [{"role": 7, "content": "hi"}]})"},
      {ApiEndpoint::kChat, R"(null)"},
  };
  const std::string completions = s.url.path_prefix + endpoint_path(ApiEndpoint::kCompletions);
  const std::string valid_body = s.catalogue.front().body().dump();
  std::string kind;
  std::string bytes;
  bool half_close = false;
  switch (std::uniform_int_distribution<int>(0, 4)(rng)) {
    case 0:
      kind = "invalid JSON";
      bytes = http_request("POST", completions, s.url,
                           R"({"prompt": "Once upon a time", "max_tokens": 8,)", s.headers(true));
      break;
    case 1: {
      kind = "wrong types";
      const auto& [endpoint, body] =
          kWrongTypes[std::uniform_int_distribution<size_t>(0, kWrongTypes.size() - 1)(rng)];
      bytes = http_request("POST", s.url.path_prefix + endpoint_path(endpoint), s.url, body,
                           s.headers(true));
      break;
    }
    case 2:
      kind = "too-short Content-Length";
      bytes = http_request("POST", completions, s.url, valid_body, s.headers(true),
                           valid_body.size() / 2);
      break;
    case 3: {
      kind = "garbage bytes";
      const size_t size = std::uniform_int_distribution<size_t>(16, 2048)(rng);
      std::uniform_int_distribution<int> byte(0, 255);
      for (size_t i = 0; i < size; ++i) bytes.push_back(static_cast<char>(byte(rng)));
      break;
    }
    default:
      kind = "body cut short by a half-close";
      bytes = http_request("POST", completions, s.url, valid_body, s.headers(true));
      bytes.resize(bytes.size() - valid_body.size() / 2);
      half_close = true;
  }
  // A server may wait for the rest of a request it cannot parse yet (garbage without a blank
  // line): after 5 s the client gives up, as a real one would.
  const Clock::time_point deadline = after(5);
  auto opened = RawConnection::open(s.url, deadline);
  if (auto* reason = std::get_if<std::string>(&opened)) {
    s.count("malformed", kind + ": connect failed: " + *reason);
    return;
  }
  RawConnection& connection = *std::get<0>(opened);
  if (auto error = connection.send(bytes, deadline)) {
    // The server may answer and close before reading everything (garbage): not a failure.
    s.count("malformed", kind + ": send failed");
    return;
  }
  if (half_close) connection.shutdown_write();
  auto head = connection.read_head(deadline);
  if (auto* reason = std::get_if<std::string>(&head)) {
    s.count("malformed", kind + ": " + *reason);
    return;
  }
  s.count("malformed", fmt::format("{}: http {}", kind, std::get<ResponseHead>(head).status));
}

// Streams a long answer and reads it at config.slow_reader_bytes_per_s until the deadline.
void run_slow_readers(SoakState& s) {
  SoakRequest request = s.catalogue.front();
  request.n = 4;
  request.max_tokens = 384;
  request.stop.clear();
  nlohmann::json body = request.body();
  body["ignore_eos"] = true;
  const std::string path = s.url.path_prefix + endpoint_path(request.endpoint);
  const size_t bytes_per_tick = static_cast<size_t>(std::max(1, s.config.slow_reader_bytes_per_s));
  while (Clock::now() < s.deadline) {
    auto opened = RawConnection::open(s.url, after(10), 4096);
    if (auto* reason = std::get_if<std::string>(&opened)) {
      s.count("slow reader", "connect failed: " + *reason);
      sleep_until_or(after(1), s.deadline);
      continue;
    }
    RawConnection& connection = *std::get<0>(opened);
    if (auto error = connection.send(
            http_request("POST", path, s.url, body.dump(), s.headers(true)), after(10))) {
      s.count("slow reader", "send failed");
      continue;
    }
    auto head = connection.read_head(after(30));
    if (auto* reason = std::get_if<std::string>(&head)) {
      s.count("slow reader", "no response: " + *reason);
      continue;
    }
    if (const int status = std::get<ResponseHead>(head).status; status != 200) {
      s.count("slow reader", fmt::format("http {}", status));
      sleep_until_or(after(1), s.deadline);
      continue;
    }
    std::string outcome = "still reading at the end";
    for (Clock::time_point tick = Clock::now(); Clock::now() < s.deadline;) {
      tick += std::chrono::seconds(1);
      const BodyRead read = connection.read_body(bytes_per_tick, std::min(tick, s.deadline));
      if (read.status == BodyRead::Status::kEnd) {
        outcome = "read its stream to the end";
        break;
      }
      if (read.status == BodyRead::Status::kClosed || read.status == BodyRead::Status::kError) {
        outcome = "the server closed the stream";
        break;
      }
      sleep_until_or(tick, s.deadline);
    }
    s.count("slow reader", outcome);
  }
}

// Holds config.num_slow_loris connections that send a request head announcing a 100000-byte
// body, then one byte per interval; one the server closes is counted and reopened.
void run_slow_loris(SoakState& s) {
  struct Loris {
    std::unique_ptr<RawConnection> connection;
    Clock::time_point opened;
  };
  std::vector<Loris> loris(static_cast<size_t>(s.config.num_slow_loris));
  std::vector<std::string> headers = s.headers(true);
  const std::string head =
      http_request("POST", s.url.path_prefix + endpoint_path(ApiEndpoint::kCompletions), s.url, "",
                   headers, 100000) +
      "{";
  std::vector<double> held_s;
  while (Clock::now() < s.deadline) {
    const Clock::time_point next = after(s.config.slow_loris_interval_s);
    for (Loris& l : loris) {
      if (Clock::now() >= s.deadline) break;
      if (!l.connection) {
        auto opened = RawConnection::open(s.url, after(2));
        if (auto* reason = std::get_if<std::string>(&opened)) {
          s.count("slow-loris", "connect failed: " + *reason);
          continue;
        }
        l.connection = std::move(std::get<0>(opened));
        l.opened = Clock::now();
        if (l.connection->send(head, after(2))) {
          s.count("slow-loris", "closed by the server (head not accepted)");
          l.connection.reset();
        }
        continue;
      }
      std::string outcome;
      if (l.connection->readable_or_closed()) {
        auto response = l.connection->read_head(after(0.2));
        outcome = std::holds_alternative<ResponseHead>(response)
                      ? fmt::format("closed by the server (http {})",
                                    std::get<ResponseHead>(response).status)
                      : std::string("closed by the server (no response)");
      } else if (l.connection->send(" ", after(1))) {
        outcome = "closed by the server (send failed)";
      }
      if (!outcome.empty()) {
        s.count("slow-loris", outcome);
        held_s.push_back(Seconds(Clock::now() - l.opened).count());
        l.connection.reset();
      }
    }
    sleep_until_or(next, s.deadline);
  }
  for (const Loris& l : loris) {
    if (l.connection) s.count("slow-loris", "held open until the end");
  }
  std::lock_guard lock(s.mutex);
  for (const double seconds : held_s) s.slow_loris_held_ms.push_back(1e3 * seconds);
}

struct Answer {
  int status = 0;
  std::string body;
  std::string error;  // empty when a response arrived
};

// A plain request (`body` empty: none) on a fresh connection, read to its end.
Answer ask(const SoakState& s, const std::string& method, const std::string& path,
           const std::string& body, double timeout_s) {
  const Clock::time_point deadline = after(timeout_s);
  auto opened = RawConnection::open(s.url, deadline);
  if (auto* reason = std::get_if<std::string>(&opened)) return {.error = *reason};
  RawConnection& connection = *std::get<0>(opened);
  if (auto error = connection.send(
          http_request(method, s.url.path_prefix + path, s.url, body, s.headers(!body.empty())),
          deadline))
    return {.error = *error};
  auto head = connection.read_head(deadline);
  if (auto* reason = std::get_if<std::string>(&head)) return {.error = *reason};
  Answer answer{.status = std::get<ResponseHead>(head).status};
  for (;;) {
    BodyRead read = connection.read_body(65536, deadline);
    if (read.status != BodyRead::Status::kData) {
      if (read.status != BodyRead::Status::kEnd) answer.error = "body: " + read.error;
      return answer;
    }
    answer.body += read.bytes;
  }
}

Answer get(const SoakState& s, const std::string& path, double timeout_s) {
  return ask(s, "GET", path, "", timeout_s);
}

// The served model's layers and KV heads, from /v1/models (sieve's "sieve" object); a server
// that does not say gets the default shape.
ModelShape served_model_shape(const SoakState& s) {
  const Answer models = get(s, "/v1/models", 10);
  ModelShape shape;
  if (!models.error.empty() || models.status != 200) return shape;
  const nlohmann::json body = nlohmann::json::parse(models.body, nullptr, false);
  const nlohmann::json* card =
      body.is_object() && body.contains("data") && body["data"].is_array() && !body["data"].empty()
          ? &body["data"][0]
          : nullptr;
  if (!card || !card->contains("sieve") || !(*card)["sieve"].is_object()) return shape;
  const nlohmann::json& sieve = (*card)["sieve"];
  if (sieve.value("num_layers", 0) > 0) shape.num_layers = sieve["num_layers"].get<int64_t>();
  if (sieve.value("num_kv_heads", 0) > 0) shape.num_kv_heads = sieve["num_kv_heads"].get<int64_t>();
  return shape;
}

void run_health_probe(SoakState& s) {
  while (!s.load_done) {
    const Clock::time_point start = Clock::now();
    const Answer answer = get(s, "/health", 5);
    const double ms = ms_since(start);
    {
      std::lock_guard lock(s.mutex);
      if (answer.error.empty() && answer.status == 200) {
        s.health_ms.push_back(ms);
      } else {
        ++s.report.health_failures;
      }
      ++s.report.outcomes["health"][answer.error.empty() ? fmt::format("http {}", answer.status)
                                                         : excerpt(answer.error, 60)];
    }
    std::this_thread::sleep_until(start + std::chrono::milliseconds(500));
  }
}

// A greedy request served alone for a reference; throws when it fails.
StreamResult serve_reference(const SoakState& s, const SoakRequest& request) {
  StreamResult r = stream_request(s, request, {});
  if (!r.completed)
    fail("the reference request '{}' served alone failed: {}", request.label(), r.outcome);
  return r;
}

// Each catalogue request of one answer gets a next turn, served cold (the server's prefix cache
// and parked conversations dropped first) and then right after its first turn again.
void serve_conversation_references(SoakState& s) {
  for (size_t idx = 0; idx < s.catalogue.size(); ++idx) {
    const SoakRequest& first = s.catalogue[idx];
    if (first.n != 1) continue;
    SoakState::Conversation c{
        .first = idx, .next = next_turn(first, s.references[idx][0], s.conversations.size())};
    // POST without a body: the path is vLLM's (sieve answers 409 while requests run).
    const Answer reset = ask(s, "POST", "/reset_prefix_cache", "", 30);
    if (!reset.error.empty() || reset.status != 200) {
      fail(
          "POST /reset_prefix_cache did not answer 200 ({}): the soak's conversations need a "
          "cold server for their references",
          reset.error.empty() ? fmt::format("http {}: {}", reset.status, excerpt(reset.body, 80))
                              : reset.error);
    }
    c.cold = serve_reference(s, c.next).texts;
    if (serve_reference(s, first).texts != s.references[idx])
      fail("the reference request '{}' answered differently the second time", first.label());
    const StreamResult continued = serve_reference(s, c.next);
    c.continued = continued.texts;
    c.continued_tokens = continued.continued_tokens.value_or(0);
    if (c.continued_tokens > 0) {
      ++s.report.conversation_references_continued;
    } else {  // no parked state (`full`, a stop string cut the answer): prefix-cache hits only
      check_greedy(s, c.next.label() + ", after its first turn", c.cold, c.continued);
    }
    s.conversations.push_back(std::move(c));
  }
  s.report.num_conversations = static_cast<int64_t>(s.conversations.size());
}

// The value of an unlabelled-or-labelled gauge in Prometheus text, summed over its series.
std::optional<int64_t> gauge(const std::string& metrics, std::string_view name) {
  std::optional<double> sum;
  size_t pos = 0;
  while ((pos = metrics.find(name, pos)) != std::string::npos) {
    const bool line_start = pos == 0 || metrics[pos - 1] == '\n';
    const char next = pos + name.size() < metrics.size() ? metrics[pos + name.size()] : '\n';
    const size_t end = metrics.find('\n', pos);
    if (line_start && (next == '{' || next == ' ')) {
      const std::string line = metrics.substr(pos, end - pos);
      sum = sum.value_or(0) + std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
    }
    if (end == std::string::npos) break;
    pos = end;
  }
  if (!sum) return std::nullopt;
  return static_cast<int64_t>(*sum);
}

// Waits until no request runs or waits and no page is in use (or the settle timeout), and
// records what /metrics said last.
void settle(SoakState& s) {
  const Clock::time_point deadline = after(s.config.settle_timeout_s);
  do {
    const Answer answer = get(s, "/metrics", 5);
    if (answer.error.empty() && answer.status == 200) {
      s.report.kv_pages_used_after = gauge(answer.body, "sieve:kv_pages_used");
      s.report.requests_running_after = gauge(answer.body, "vllm:num_requests_running");
      s.report.requests_waiting_after = gauge(answer.body, "vllm:num_requests_waiting");
      if (s.report.kv_pages_used_after == 0 && s.report.requests_running_after == 0 &&
          s.report.requests_waiting_after == 0)
        return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  } while (Clock::now() < deadline);
}

}  // namespace

SoakReport run_soak(const SoakConfig& config) {
  SoakState s{.config = config, .url = parse_base_url(config.base_url)};
  const Answer health = get(s, "/health", 10);
  if (!health.error.empty() || health.status != 200) {
    fail("{}/health did not answer 200 ({}): is the server up and ready?", s.url.origin(),
         health.error.empty() ? fmt::format("http {}", health.status) : health.error);
  }
  s.catalogue = soak_catalogue(served_model_shape(s));
  for (const SoakRequest& request : s.catalogue) {
    const StreamResult r = stream_request(s, request, {});
    if (!r.completed)
      fail("the reference request '{}' served alone failed: {}", request.label(), r.outcome);
    s.references.push_back(r.texts);
  }
  s.report.num_references = static_cast<int64_t>(s.references.size());
  serve_conversation_references(s);

  const Clock::time_point load_start = Clock::now();
  s.deadline = after(config.duration_s);
  std::vector<std::thread> threads;
  std::thread probe([&] { run_health_probe(s); });
  for (int c = 0; c < config.num_clients; ++c) {
    threads.emplace_back([&s, c] {
      std::mt19937_64 rng(s.config.seed * 1000003 + static_cast<uint64_t>(c));
      // 80% normal, 20% conversations; with abuse: 55% normal, 15% conversations, 12%
      // disconnects, 8% cancellations, 10% malformed.
      std::discrete_distribution<int> action =
          s.config.abuse ? std::discrete_distribution<int>({55, 15, 12, 8, 10})
                         : std::discrete_distribution<int>({80, 20});
      while (Clock::now() < s.deadline) {
        switch (action(rng)) {
          case 0:
            run_normal(s, rng);
            break;
          case 1:
            run_conversation(s, rng);
            break;
          case 2:
            run_disconnect(s, rng);
            break;
          case 3:
            run_cancel(s, rng);
            break;
          default:
            run_malformed(s, rng);
        }
      }
    });
  }
  if (config.abuse) {
    for (int r = 0; r < config.num_slow_readers; ++r)
      threads.emplace_back([&s] { run_slow_readers(s); });
    if (config.num_slow_loris > 0) threads.emplace_back([&s] { run_slow_loris(s); });
  }
  for (std::thread& t : threads) t.join();
  s.report.load_seconds = Seconds(Clock::now() - load_start).count();
  s.load_done = true;
  probe.join();
  settle(s);
  s.report.normal_ttft = summarize_latency(std::move(s.ttft_ms));
  s.report.health = summarize_latency(std::move(s.health_ms));
  s.report.slow_loris_held = summarize_latency(std::move(s.slow_loris_held_ms));
  return std::move(s.report);
}

}  // namespace sieve::loadgen
