#pragma once
// Responses of every endpoint, apart from HTTP: engine events become OpenAI response objects and
// stream chunks; token ids, models and texts become /tokenize, /detokenize and /v1/models
// bodies. Pure (no sockets, no engine), so every shape is unit-tested.
//
//   engine events ──► ChoiceState (per choice) ──► ResponseWriter ──► response / chunks JSON
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "server/api_requests.h"
#include "server/json.h"
#include "server/tool_calls.h"
#include "tokenizer/tokenizer.h"

namespace sieve::server {

// What a completions choice repeats before its own text (echo): its prompt's text and, with
// logprobs, the prompt tokens' entries (engine::RequestEvent::prompt_logprobs).
struct Echo {
  std::string text;
  std::shared_ptr<const std::vector<engine::SampleResult>> logprobs;  // null: no logprobs
};

// What one choice (one sample of one prompt) has produced so far.
struct ChoiceState {
  std::string text;
  std::vector<TokenId> tokens;  // the ids of text (and of what a stop string cut from it)
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
  int64_t continued_tokens = 0;  // of cached_tokens, from a parked compressed state (extension)
  int64_t kv_pages = 0;          // pages the sequences held at the end (extension)
  int64_t kv_dense_pages = 0;    // what the same tokens take with the full cache
  int64_t kv_bytes = 0;          // the same two in bytes (of the server's KV dtype)
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
  // finish reason ("tool_calls" when the choice made calls; "length" when its output was cut
  // off, and a call it was writing is dropped) on the last chunk. Logprobs ride on the first
  // chunk (an empty content delta when the text is held back).
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

// GET /v1/models: a card per name the model is served under (the served name, then the
// aliases); GET /v1/models/{id}: the card of one.
json model_card(const ModelInfo& model, const std::string& name);
json model_list(const ModelInfo& model);

// POST /tokenize and POST /detokenize.
json tokenize_response(const std::vector<TokenId>& ids, int64_t context_length);
json detokenize_response(const std::string& text);

}  // namespace sieve::server
