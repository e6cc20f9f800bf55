#pragma once
// One streaming request to an OpenAI-compatible server, timed chunk by chunk:
//   POST {base}/v1/completions or /v1/chat/completions, stream = true, usage requested
//   -> SSE "data:" events, each timestamped on arrival -> a RequestRecord.
// Failures (refused connection, HTTP errors, timeouts, malformed streams) are recorded with a
// reason, never thrown: a benchmark reports them and goes on.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loadgen/workload.h"
#include "tokenizer/tokenizer.h"

namespace sieve::loadgen {

using Clock = std::chrono::steady_clock;

// A parsed --base-url: "http://host:port" plus a path prefix that ends before /v1.
struct ServerUrl {
  std::string scheme;  // http or https
  std::string host;
  int port = 0;
  std::string path_prefix;     // "" or e.g. "/proxy"; never ends with '/'
  std::string origin() const;  // scheme://host:port
};

// Accepts http(s)://host[:port][/prefix][/v1]. Throws sieve::Error saying what is wrong.
ServerUrl parse_base_url(const std::string& url);

std::string endpoint_path(ApiEndpoint endpoint);  // "/v1/completions" or "/v1/chat/completions"

struct ClientConfig {
  std::string base_url;
  ApiEndpoint endpoint = ApiEndpoint::kCompletions;
  std::string model;
  std::string api_key;                                   // sent as "Authorization: Bearer" when set
  nlohmann::json extra_body = nlohmann::json::object();  // merged into every request body last
  // Ask for exactly max_tokens with ignore_eos and min_tokens (vLLM, llama.cpp, sieve know them).
  bool force_output_len = true;
  double timeout_s = 600;                     // waiting for data; connecting waits at most 30 s
  const tok::Tokenizer* tokenizer = nullptr;  // counts output tokens when the server gives no usage
};

enum class TokenSource { kUsage, kTokenizer, kChunks };
const char* to_string(TokenSource source);

struct RequestRecord {
  bool ok = false;
  std::string error;          // why it failed; empty when ok
  int http_status = 0;        // 0 when no response arrived
  double start_s = 0;         // when it was sent, from the start of the run
  double ttft_s = 0;          // to the first chunk with generated text
  double e2el_s = 0;          // to the end of the stream
  std::vector<double> itl_s;  // gaps between successive chunks with text
  int64_t num_chunks = 0;     // chunks that carried text
  int64_t output_tokens = 0;
  TokenSource output_tokens_source = TokenSource::kChunks;
  std::optional<int64_t> prompt_tokens;  // the server's usage.prompt_tokens
  // usage.prompt_tokens_details.cached_tokens: prompt tokens the server did not compute.
  std::optional<int64_t> cached_tokens;
  int32_t conversation = -1;  // multi-turn runs: which simulated user, and which of its turns
  int32_t turn = -1;
  std::optional<int64_t> input_tokens;  // the workload's count (no BOS)
  int64_t requested_output_tokens = 0;
  std::string finish_reason;
  std::string generated_text;

  // (E2E - TTFT) / (output tokens - 1); none with fewer than two tokens.
  std::optional<double> tpot_s() const;
};

nlohmann::json request_body(const ClientConfig& config, const Prompt& prompt);

// A connection to the server kept open between requests (HTTP keep-alive, as vLLM's benchmark
// client does), so that a worker pays for connecting once rather than per request, and a burst
// of requests is not a burst of connects. Reconnects when the server has closed it. One request
// at a time.
class Connection {
 public:
  Connection(const ServerUrl& url, const ClientConfig& config);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends one request and waits for the end of its stream; run_start anchors start_s.
  RequestRecord send(const Prompt& prompt, Clock::time_point run_start);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One request on a fresh connection.
RequestRecord send_request(const ServerUrl& url, const ClientConfig& config, const Prompt& prompt,
                           Clock::time_point run_start);

// The start of a text for an error message: at most max_chars, on one line.
std::string excerpt(std::string_view text, size_t max_chars = 200);

}  // namespace sieve::loadgen
