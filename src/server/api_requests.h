#pragma once
// The request of every endpoint, parsed and validated apart from HTTP: a JSON body (or a path's
// id) becomes what the handler needs, or an ApiException naming the bad parameter. Pure (no
// sockets, no engine), so every rule is unit-tested.
//
//   POST /v1/completions, /v1/chat/completions ──► parse_generation_request ──► GenerationRequest
//        {prompts (token ids), SamplingParams, stream options, logprobs shape, tool calls}
//        (its parts: sampling_request.h for sampling and constraints, chat_request.h for
//        messages, templates and tools)
//   POST /tokenize   ──► parse_tokenize_request   ──► token ids
//   POST /detokenize ──► parse_detokenize_request ──► token ids
//   GET /v1/models/{id}, "model" ──► check_model_name ──► 404 unless served
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "grammar/grammar_cache.h"
#include "hf/generation_config.h"
#include "server/answer_tokens.h"
#include "server/api_error.h"
#include "server/json.h"
#include "server/tool_calls.h"
#include "sparsity/policy_spec.h"
#include "speculative/speculative_config.h"
#include "tokenizer/tokenizer.h"

namespace sieve::server {

using tok::TokenId;

enum class ApiKind { kCompletion, kChat };

// What parsing needs to know about the served model.
struct ModelInfo {
  std::string served_name;
  std::vector<std::string> aliases;  // other names "model" may give (--served-model-name)
  int64_t context_length = 0;
  // The model's layers and KV heads, which a kv_policy may name (/v1/models says them).
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
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
  // Recent answers' ids, kept where a prompt's text resends them (null: plain tokenization).
  const AnswerTokens* answers = nullptr;
  // Defaults for what a body leaves out, from the model's generation_config.json (vLLM's
  // --generation-config): unset fields keep OpenAI's; max_new_tokens caps every request's
  // max_tokens; eos_token_id ids join the stop_token_ids of every request that does not ignore EOS.
  hf::GenerationConfig sampling_defaults;

  // A prompt text's ids: as model.answers keeps them, else the tokenizer's.
  std::vector<TokenId> encode_prompt(std::string_view text, tok::EncodeOptions options) const;
};

// A request body as JSON: 400 (param "body") unless it is a JSON object.
json parse_request_body(std::string_view text);

// Whether `name` is the served model or one of its aliases; check_model_name throws the 404.
bool serves_model(const ModelInfo& model, std::string_view name);
void check_model_name(const ModelInfo& model, const std::string& name);

struct GenerationRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;  // the name the request gave (an alias too), else served_name: echoed back
  std::vector<std::vector<TokenId>> prompts;  // one per prompt; each runs params.n samples
  // [prompt] the text it was encoded from, and how ("" for token ids): with the answer, what
  // AnswerTokens remembers.
  std::vector<std::string> prompt_texts;
  tok::EncodeOptions prompt_encoding;
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

// POST /tokenize: {"prompt": text, "add_special_tokens"?: bool} (default true), or a chat's
// {"messages", ...} tokenized as /v1/chat/completions would prompt the model (its "model" is
// not checked, and it may be longer than the context: the count tells a client how much to cut).
std::vector<TokenId> parse_tokenize_request(const json& body, const ModelInfo& model);

// POST /detokenize: {"tokens": [token ids]}.
std::vector<TokenId> parse_detokenize_request(const json& body, size_t vocab_size);

}  // namespace sieve::server
