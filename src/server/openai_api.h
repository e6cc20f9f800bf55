#pragma once
// The OpenAI wire format, apart from HTTP: JSON bodies of /v1/completions and
// /v1/chat/completions become validated engine requests, and engine events become OpenAI
// response objects and stream chunks. Everything here is pure (no sockets, no engine), so
// every rule is unit-tested.
//
//   body ──► parse_generation_request ──► GenerationRequest {prompts (token ids), SamplingParams,
//            (ApiException names the bad parameter)      stream options, logprobs shape}
//   engine events ──► ChoiceState (per choice) ──► ResponseWriter ──► response / chunks JSON
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "grammar/grammar_cache.h"
#include "sparsity/policy_spec.h"
#include "speculative/speculative_config.h"
#include "server/tool_calls.h"
#include "tokenizer/tokenizer.h"

namespace sieve::server {

using nlohmann::json;
using tok::TokenId;

// An error as the client sees it: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::optional<std::string> param;
  std::optional<std::string> code;
  json to_json() const;
};

class ApiException : public std::runtime_error {
 public:
  explicit ApiException(ApiError error)
      : std::runtime_error(error.message), error_(std::move(error)) {}
  const ApiError& error() const { return error_; }

 private:
  ApiError error_;
};

// 400 naming the parameter.
[[noreturn]] void throw_invalid(std::string param, std::string message);

enum class ApiKind { kCompletion, kChat };

// What parsing needs to know about the served model.
struct ModelInfo {
  std::string served_name;
  std::vector<std::string> aliases;  // other names "model" may give (--served-model-name)
  int64_t context_length = 0;
  const tok::Tokenizer* tokenizer = nullptr;
  // Renders a chat template context ({"messages", "add_generation_prompt", "bos_token", ...})
  // to the prompt text; throws sieve::Error (e.g. raise_exception) which becomes a 400.
  std::function<std::string(const json& context)> render_chat;
  sparsity::PolicySpec default_kv_policy;  // when the body has no kv_policy (--kv-policy)
  // Compiled grammars of this model's vocabulary (response_format, grammar, tool_choice); null:
  // constrained decoding is refused.
  grammar::GrammarCache* grammars = nullptr;
  // How this model writes tool calls (--tool-call-parser, else detected from its template);
  // kNone: `tools` are rendered but the output is not read for calls.
  ToolCallFormat tool_call_format = ToolCallFormat::kNone;
};

struct GenerationRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;  // the name the request gave (an alias too), else served_name: echoed back
  std::vector<std::vector<TokenId>> prompts;  // one per prompt; each runs params.n samples
  engine::SamplingParams params;
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool continuous_usage = false;  // stream_options.continuous_usage_stats (vLLM)
  std::string user;
  sparsity::PolicySpec kv_policy;  // "kv_policy": string or object (default: full)
  // "speculative": an object with --speculative-config's keys; unset: the server's default.
  std::optional<speculative::SpeculativeConfig> speculative;
  // Chat with tools: how the output is read into tool_calls (format kNone: it is not).
  ToolCallOptions tool_calls;
  // "echo" (completions): each choice's text starts with its prompt's text, and with logprobs
  // its logprobs start with the prompt tokens' (engine::Request::prompt_logprobs, the first
  // token's null). echo_texts: [prompt] the text each prompt's choices repeat: the string as
  // sent, or its token ids decoded. With echo, max_tokens may be 0 (score the prompt only).
  bool echo = false;
  std::vector<std::string> echo_texts;
  std::optional<int32_t> prompt_logprobs;  // for the engine: echo with logprobs
};

// Validates `body` and tokenizes its prompt(s) or messages. Unknown fields are ignored; a wrong
// type or out-of-range value throws ApiException naming the parameter; a prompt that does not
// fit the context throws ApiException with code "context_length_exceeded".
GenerationRequest parse_generation_request(ApiKind kind, const json& body, const ModelInfo& model);

// Chat messages → the template's context, with each message's content flattened to text and
// the arguments of an assistant message's tool_calls (a JSON string in OpenAI's format) parsed
// into an object, as the templates (Llama 3.1's, Qwen's) print them with tojson.
json chat_template_context(const json& messages, bool add_generation_prompt,
                           const tok::Tokenizer& tokenizer);

// What a completions choice repeats before its own text (echo): its prompt's text and, with
// logprobs, the prompt tokens' entries (engine::RequestEvent::prompt_logprobs).
struct Echo {
  std::string text;
  std::shared_ptr<const std::vector<engine::SampleResult>> logprobs;  // null: no logprobs
};

// What one choice (one sample of one prompt) has produced so far.
struct ChoiceState {
  std::string text;
  std::vector<engine::SampleResult> logprobs;
  std::optional<engine::Finish> finish;
  int32_t completion_tokens = 0;
  size_t text_offset = 0;    // completions logprobs: offset of the next token's text
  std::optional<Echo> echo;  // echo: set by the choice's first event
  bool echo_sent = false;    // streaming: the echo went out (in the choice's first chunk)
  // Streaming chat with tool-call parsing: reads the text as it comes (unset: no parsing).
  std::optional<ToolCallParser> tool_parser;
};

struct UsageTotals {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t kv_pages = 0;        // pages the sequences held at the end (extension)
  int64_t kv_dense_pages = 0;  // what the same tokens take with the full cache
  int64_t kv_bytes = 0;        // the same two in bytes (of the server's KV dtype)
  int64_t kv_dense_bytes = 0;
  double recovery_sum = 0.0;  // attention recovery of the scored sequences, summed
  int64_t recovery_count = 0;
  // Speculative decoding (extension): draft tokens verified and accepted. Reported as
  // "speculative" when the request ran with speculation on (its own or the server's config),
  // even if no draft was found; absent otherwise.
  bool speculative = false;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  json to_json() const;
};

// Builds the response objects of one request (one id, one creation time).
class ResponseWriter {
 public:
  ResponseWriter(ApiKind kind, std::string model_name, const tok::Tokenizer& tokenizer,
                 bool want_logprobs, ToolCallOptions tool_calls = {});
  const std::string& id() const { return id_; }

  // Non-streaming response with every choice.
  json response(const std::vector<ChoiceState>& choices, const UsageTotals& usage) const;
  // Chat only: the first chunk of a choice, carrying the role.
  json role_chunk(int32_t index) const;
  // A chunk with new text (and its tokens' logprobs) and, on the last one, the finish reason.
  // `offset` is the completions text offset of the first new token (updated). `echo` (the
  // choice's first chunk, completions): its text and logprobs come first.
  json delta_chunk(int32_t index, const std::string& text,
                   std::span<const engine::SampleResult> logprobs,
                   const std::optional<engine::Finish>& finish, size_t& offset,
                   const Echo* echo = nullptr) const;
  // Chat with tool-call parsing (choice.tool_parser set): the chunks for a choice's new text,
  // read by its parser: a content delta for text that is surely content, then for each call
  // parsed a delta with its index, id, type and name and one with its whole arguments; the
  // finish reason ("tool_calls" when the choice made calls) on the last chunk. Logprobs ride on
  // the first chunk (an empty content delta when the text is held back).
  std::vector<json> tool_delta_chunks(ChoiceState& choice, int32_t index, const std::string& text,
                                      std::span<const engine::SampleResult> logprobs,
                                      const std::optional<engine::Finish>& finish,
                                      size_t& offset) const;
  // The final usage chunk (empty choices) of stream_options.include_usage.
  json usage_chunk(const UsageTotals& usage) const;

 private:
  json logprobs_json(std::span<const engine::SampleResult> logprobs, size_t& offset) const;
  // Completions logprobs of an echoed prompt followed by the choice's own tokens: the prompt
  // tokens' text offsets point into echo.text, the first token has null logprob and top_logprobs,
  // and the own tokens' offsets start at echo.text's end. Null without logprobs.
  json echo_logprobs_json(const Echo& echo, std::span<const engine::SampleResult> logprobs,
                          size_t& offset) const;
  json base(std::string_view object) const;

  ApiKind kind_;
  std::string model_;
  const tok::Tokenizer& tokenizer_;
  bool want_logprobs_;
  ToolCallOptions tool_calls_;
  std::string id_;
  int64_t created_;
};

// "stop" / "length" as OpenAI spells them, and vLLM's stop_reason (matched id or string).
json finish_reason_json(const std::optional<engine::Finish>& finish);
json stop_reason_json(const std::optional<engine::Finish>& finish);

// The engine's refusal of a request, in OpenAI's terms: status and type by kind, its param.
ApiError admission_api_error(const engine::AdmissionError& refusal);

}  // namespace sieve::server
