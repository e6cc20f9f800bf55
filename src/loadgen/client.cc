#include "loadgen/client.h"

#include <httplib.h>

#include <cmath>
#include <regex>

#include "loadgen/sse.h"
#include "util/clock.h"
#include "util/error.h"

namespace sieve::loadgen {

namespace {

// Long enough for SYN retries (1 + 2 + 4 + 8 s) when a server's listen backlog overflows.
constexpr int64_t kMaxConnectTimeoutUs = 30'000'000;

// The message of an OpenAI-style error body ({"error": {"message": ...}} or {"error": "..."}),
// else the start of the body.
std::string error_message(std::string_view body) {
  try {
    const nlohmann::json j = nlohmann::json::parse(body);
    if (j.contains("error")) {
      const nlohmann::json& e = j["error"];
      if (e.is_string()) return e.get<std::string>();
      if (e.is_object() && e.contains("message") && e["message"].is_string())
        return e["message"].get<std::string>();
    }
    if (j.contains("detail") && j["detail"].is_string()) return j["detail"].get<std::string>();
    if (j.contains("message") && j["message"].is_string()) return j["message"].get<std::string>();
  } catch (const nlohmann::json::exception&) {
  }
  return body.empty() ? std::string("(empty body)") : excerpt(body);
}

// Accumulates one streamed response as its events arrive.
class StreamReader {
 public:
  StreamReader(const ClientConfig& config, Clock::time_point sent, RequestRecord& record)
      : config_(config), sent_(sent), record_(record) {}

  // False stops the transfer (a server error inside the stream, or garbage).
  bool on_bytes(std::string_view bytes) {
    const Clock::time_point now = Clock::now();
    if (record_.http_status != 200) {
      if (error_body_.size() < 65536) error_body_.append(bytes);
      return true;
    }
    for (const std::string& data : parser_.feed(bytes)) {
      if (!on_event(data, now)) return false;
    }
    return true;
  }

  void on_end() {
    const Clock::time_point now = Clock::now();
    for (const std::string& data : parser_.finish()) {
      if (!on_event(data, now)) return;
    }
  }

  bool saw_done() const { return saw_done_; }
  bool saw_event() const { return saw_event_; }
  const std::string& stream_error() const { return stream_error_; }
  const std::string& error_body() const { return error_body_; }
  std::optional<int64_t> usage_completion_tokens() const { return completion_tokens_; }

 private:
  bool on_event(const std::string& data, Clock::time_point now) {
    saw_event_ = true;
    if (data == "[DONE]") {
      saw_done_ = true;
      return true;
    }
    nlohmann::json chunk;
    try {
      chunk = nlohmann::json::parse(data);
    } catch (const nlohmann::json::exception&) {
      stream_error_ = "malformed stream chunk: " + excerpt(data);
      return false;
    }
    if (!chunk.is_object()) {
      stream_error_ = "malformed stream chunk: " + excerpt(data);
      return false;
    }
    if (chunk.contains("error")) {
      stream_error_ = "server error in stream: " + error_message(data);
      return false;
    }
    if (chunk.contains("usage") && chunk["usage"].is_object()) {
      const nlohmann::json& usage = chunk["usage"];
      if (usage.contains("completion_tokens") && usage["completion_tokens"].is_number_integer()) {
        completion_tokens_ = usage["completion_tokens"].get<int64_t>();
      }
      if (usage.contains("prompt_tokens") && usage["prompt_tokens"].is_number_integer()) {
        record_.prompt_tokens = usage["prompt_tokens"].get<int64_t>();
      }
      const nlohmann::json details = usage.value("prompt_tokens_details", nlohmann::json());
      if (details.is_object() && details.contains("cached_tokens") &&
          details["cached_tokens"].is_number_integer()) {
        record_.cached_tokens = details["cached_tokens"].get<int64_t>();
      }
    }
    if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty())
      return true;
    const nlohmann::json& choice = chunk["choices"][0];
    if (!choice.is_object()) return true;
    std::string text;
    if (config_.endpoint == ApiEndpoint::kChat) {
      if (choice.contains("delta") && choice["delta"].is_object()) {
        const nlohmann::json& delta = choice["delta"];
        for (const char* key : {"content", "reasoning_content"}) {
          if (delta.contains(key) && delta[key].is_string()) text += delta[key].get<std::string>();
        }
      }
    } else if (choice.contains("text") && choice["text"].is_string()) {
      text = choice["text"].get<std::string>();
    }
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
      record_.finish_reason = choice["finish_reason"].get<std::string>();
    }
    if (text.empty()) return true;
    if (record_.num_chunks == 0) {
      record_.ttft_s = seconds_between(sent_, now);
    } else {
      record_.itl_s.push_back(seconds_between(last_chunk_, now));
    }
    last_chunk_ = now;
    ++record_.num_chunks;
    record_.generated_text += text;
    return true;
  }

  const ClientConfig& config_;
  Clock::time_point sent_;
  RequestRecord& record_;
  SseParser parser_;
  Clock::time_point last_chunk_;
  std::optional<int64_t> completion_tokens_;
  std::string stream_error_;
  std::string error_body_;
  bool saw_done_ = false;
  bool saw_event_ = false;
};

std::string transport_error(httplib::Error error, const ServerUrl& url, const ClientConfig& config,
                            double elapsed_s, bool got_response) {
  switch (error) {
    case httplib::Error::Connection:
      return fmt::format("cannot connect to {} (connection refused or host unreachable)",
                         url.origin());
    case httplib::Error::ConnectionTimeout:
      return fmt::format("timed out connecting to {}", url.origin());
    case httplib::Error::Read:
      if (elapsed_s >= 0.99 * config.timeout_s) {
        return fmt::format("timed out after {:.0f} s without data from the server (--timeout)",
                           config.timeout_s);
      }
      // Also what a burst of connects beyond a server's listen backlog looks like (cpp-httplib
      // servers listen with a backlog of 5): dropped, retried by TCP a second later, then reset.
      return got_response ? "the server closed the connection before the response was complete"
                          : "the server closed the connection without responding";
    case httplib::Error::Write:
      return "the connection failed while sending the request";
    case httplib::Error::SSLConnection:
    case httplib::Error::SSLLoadingCerts:
    case httplib::Error::SSLServerVerification:
      return fmt::format("TLS error talking to {}: {}", url.origin(), httplib::to_string(error));
    default:
      return fmt::format("request failed: {}", httplib::to_string(error));
  }
}

}  // namespace

std::string excerpt(std::string_view text, size_t max_chars) {
  std::string out(text.substr(0, max_chars));
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  if (text.size() > max_chars) out += "...";
  return out;
}

std::string ServerUrl::origin() const { return fmt::format("{}://{}:{}", scheme, host, port); }

ServerUrl parse_base_url(const std::string& url) {
  static const std::regex kUrl(
      R"(^(https?)://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._~%-]+)(?::([0-9]{1,5}))?(/[^?#]*)?$)");
  std::smatch match;
  if (!std::regex_match(url, match, kUrl)) {
    fail("bad --base-url '{}': expected http://HOST[:PORT][/PATH], e.g. http://127.0.0.1:8080",
         url);
  }
  ServerUrl parsed;
  parsed.scheme = match[1].str();
  parsed.host = match[2].str();
  if (parsed.host.starts_with('[')) parsed.host = parsed.host.substr(1, parsed.host.size() - 2);
  parsed.port = parsed.scheme == "https" ? 443 : 80;
  if (match[3].matched) {
    parsed.port = std::stoi(match[3].str());
    if (parsed.port <= 0 || parsed.port > 65535)
      fail("bad --base-url '{}': port out of range", url);
  }
  std::string path = match[4].matched ? match[4].str() : "";
  while (path.ends_with('/')) path.pop_back();
  // OpenAI clients take the base URL with /v1; accept both spellings.
  if (path.ends_with("/v1")) path.resize(path.size() - 3);
  parsed.path_prefix = path;
  return parsed;
}

std::string endpoint_path(ApiEndpoint endpoint) {
  return endpoint == ApiEndpoint::kChat ? "/v1/chat/completions" : "/v1/completions";
}

const char* to_string(TokenSource source) {
  switch (source) {
    case TokenSource::kUsage:
      return "usage";
    case TokenSource::kTokenizer:
      return "tokenizer";
    case TokenSource::kChunks:
      return "chunks";
  }
  return "chunks";
}

std::optional<double> RequestRecord::tpot_s() const {
  if (!ok || output_tokens < 2) return std::nullopt;
  return (e2el_s - ttft_s) / static_cast<double>(output_tokens - 1);
}

nlohmann::json request_body(const ClientConfig& config, const Prompt& prompt) {
  nlohmann::json body = {{"stream", true},
                         {"stream_options", {{"include_usage", true}}},
                         {"max_tokens", prompt.output_tokens},
                         {"temperature", 0.0}};
  if (!config.model.empty()) body["model"] = config.model;
  if (config.endpoint == ApiEndpoint::kChat) {
    body["messages"] = prompt.messages
                           ? *prompt.messages
                           : nlohmann::json::array({{{"role", "user"}, {"content", prompt.text}}});
  } else {
    body["prompt"] = prompt.text;
  }
  if (config.force_output_len) {
    body["ignore_eos"] = true;
    body["min_tokens"] = prompt.output_tokens;
  }
  // A JSON merge patch: nested objects merge, null removes a field the server would reject.
  if (!config.extra_body.is_null()) body.merge_patch(config.extra_body);
  return body;
}

struct Connection::Impl {
  Impl(const ServerUrl& url, const ClientConfig& config)
      : url(url), config(config), client(url.origin()) {
    const auto timeout = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::duration<double>(config.timeout_s));
    const auto connect_timeout = std::min(timeout, std::chrono::microseconds(kMaxConnectTimeoutUs));
    client.set_connection_timeout(connect_timeout.count() / 1000000,
                                  connect_timeout.count() % 1000000);
    client.set_read_timeout(timeout);
    client.set_write_timeout(timeout);
    client.set_keep_alive(true);
    client.set_tcp_nodelay(
        true);  // headers and body go out as two writes: no 40 ms Nagle + delayed-ACK stall
  }
  ServerUrl url;
  ClientConfig config;
  httplib::Client client;
};

Connection::Connection(const ServerUrl& url, const ClientConfig& config)
    : impl_(std::make_unique<Impl>(url, config)) {}
Connection::~Connection() = default;

RequestRecord send_request(const ServerUrl& url, const ClientConfig& config, const Prompt& prompt,
                           Clock::time_point run_start) {
  return Connection(url, config).send(prompt, run_start);
}

RequestRecord Connection::send(const Prompt& prompt, Clock::time_point run_start) {
  const ServerUrl& url = impl_->url;
  const ClientConfig& config = impl_->config;
  httplib::Client& client = impl_->client;
  RequestRecord record;
  record.input_tokens = prompt.input_tokens;
  record.requested_output_tokens = prompt.output_tokens;

  httplib::Request request;
  request.method = "POST";
  request.path = url.path_prefix + endpoint_path(config.endpoint);
  request.body = request_body(config, prompt).dump();
  request.set_header("Content-Type", "application/json");
  request.set_header("Accept", "text/event-stream");
  // A compressed stream would reach us in the decompressor's blocks, not as the server sent it.
  request.set_header("Accept-Encoding", "identity");
  if (!config.api_key.empty()) request.set_header("Authorization", "Bearer " + config.api_key);

  const Clock::time_point sent = Clock::now();
  record.start_s = seconds_between(run_start, sent);
  StreamReader reader(config, sent, record);
  std::string content_type;
  request.response_handler = [&](const httplib::Response& response) {
    record.http_status = response.status;
    content_type = response.get_header_value("Content-Type");
    return true;
  };
  request.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
    return reader.on_bytes(std::string_view(data, length));
  };

  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  bool sent_ok = false;
  try {
    sent_ok = client.send(request, response, error);
  } catch (const std::exception& e) {
    record.error = fmt::format("request failed: {}", e.what());
    return record;
  }
  if (sent_ok || error == httplib::Error::Canceled) reader.on_end();
  const Clock::time_point done = Clock::now();
  record.e2el_s = seconds_between(sent, done);
  if (response.status > 0) record.http_status = response.status;

  if (!reader.stream_error().empty()) {
    record.error = reader.stream_error();
  } else if (!sent_ok) {
    record.error = transport_error(error, url, config, record.e2el_s, record.http_status != 0);
  } else if (record.http_status != 200) {
    record.error =
        fmt::format("HTTP {}: {}", record.http_status, error_message(reader.error_body()));
  } else if (record.num_chunks == 0) {
    record.error =
        reader.saw_event()
            ? "the stream ended without any generated text"
            : fmt::format("expected a text/event-stream response, got '{}' with no data events",
                          content_type);
  }
  if (!record.error.empty()) return record;

  record.ok = true;
  if (reader.usage_completion_tokens()) {
    record.output_tokens = *reader.usage_completion_tokens();
    record.output_tokens_source = TokenSource::kUsage;
  } else if (config.tokenizer) {
    record.output_tokens = static_cast<int64_t>(
        config.tokenizer
            ->encode(record.generated_text, {.add_special = false, .parse_special = false})
            .size());
    record.output_tokens_source = TokenSource::kTokenizer;
  } else {
    record.output_tokens = record.num_chunks;
    record.output_tokens_source = TokenSource::kChunks;
  }
  return record;
}

}  // namespace sieve::loadgen
