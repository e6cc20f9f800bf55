#include "server/api_requests.h"

#include <fmt/format.h>

#include <algorithm>

#include "server/chat_request.h"
#include "server/request_fields.h"
#include "server/sampling_request.h"
#include "util/error.h"

namespace sieve::server {

namespace {

// Largest number of prompts per request: bounds the work one body can ask for before the queue
// limit applies.
constexpr size_t kMaxPrompts = 256;
constexpr int64_t kCompletionsDefaultMaxTokens = 16;  // OpenAI's legacy default

// prompt: a string, an array of strings, an array of token ids, or an array of those arrays.
void parse_prompts(const json& body, const ModelInfo& model, GenerationRequest& request) {
  const json* prompt = field(body, "prompt");
  if (!prompt) throw_invalid("prompt", "'prompt' is required");
  const size_t vocab = model.tokenizer->vocab().size();
  const tok::EncodeOptions encode{.add_special = true, .parse_special = true};
  request.prompt_encoding = encode;
  std::vector<std::vector<TokenId>>& prompts = request.prompts;
  std::vector<std::string>& texts = request.prompt_texts;
  auto add_text = [&](std::string text) {
    prompts.push_back(model.encode_prompt(text, encode));
    texts.push_back(std::move(text));
  };
  auto add_ids = [&](const json& ids) {
    prompts.push_back(token_array(ids, "prompt", vocab));
    texts.emplace_back();
  };
  if (prompt->is_string()) {
    add_text(prompt->get<std::string>());
  } else if (prompt->is_array()) {
    if (prompt->empty()) throw_invalid("prompt", "'prompt' must not be empty");
    const json& first = prompt->front();
    if (first.is_number()) {
      add_ids(*prompt);
    } else {
      if (prompt->size() > kMaxPrompts)
        throw_invalid("prompt", fmt::format("at most {} prompts per request", kMaxPrompts));
      for (const json& item : *prompt) {
        if (item.is_string()) {
          add_text(item.get<std::string>());
        } else if (item.is_array()) {
          add_ids(item);
        } else {
          throw_invalid("prompt",
                        "'prompt' must be a string, an array of strings, an array of token ids, "
                        "or an array of token id arrays");
        }
      }
    }
  } else {
    throw_invalid("prompt",
                  "'prompt' must be a string, an array of strings, an array of token ids, "
                  "or an array of token id arrays");
  }
  for (const auto& p : prompts) {
    if (p.empty()) throw_invalid("prompt", "the prompt is empty");
  }
}

// Fields of the OpenAI API that sieve does not implement: refuse them rather than silently
// answering something else than what was asked.
void reject_unsupported(ApiKind kind, const json& body) {
  if (kind == ApiKind::kCompletion) {
    if (const json* v = field(body, "suffix");
        v && !(v->is_string() && v->get<std::string>().empty())) {
      throw_invalid("suffix", "'suffix' is not supported");
    }
  }
}

// The text each prompt's choices echo: a string prompt as sent, token ids decoded.
std::vector<std::string> echo_texts(const json& prompt,
                                    const std::vector<std::vector<TokenId>>& prompts,
                                    const tok::Tokenizer& tokenizer) {
  auto text_of = [&](const json& item, const std::vector<TokenId>& ids) {
    return item.is_string() ? item.get<std::string>() : tokenizer.decode(ids);
  };
  if (prompt.is_string() || prompt.front().is_number()) return {text_of(prompt, prompts.at(0))};
  std::vector<std::string> texts;
  for (size_t i = 0; i < prompts.size(); ++i) texts.push_back(text_of(prompt[i], prompts[i]));
  return texts;
}

// "echo" (completions; chat ignores the field, whose vLLM meaning is not implemented). With it,
// max_tokens 0 scores the prompt alone, as lm-eval-harness asks; without, max_tokens must be
// at least 1 (vLLM's rule).
void parse_echo(ApiKind kind, const json& body, const tok::Tokenizer& tokenizer,
                GenerationRequest& request) {
  if (kind == ApiKind::kCompletion) {
    if (const json* v = field(body, "echo")) request.echo = bool_of(*v, "echo");
  }
  if (request.echo) {
    request.echo_texts = echo_texts(*field(body, "prompt"), request.prompts, tokenizer);
    request.prompt_logprobs = request.params.logprobs;
  } else if (request.params.max_tokens == 0) {
    const char* name =
        field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    throw_invalid(name, fmt::format("'{}' must be at least 1 (0 only with 'echo', to score the "
                                    "prompt)",
                                    name));
  }
}

void check_context(const std::vector<TokenId>& prompt, engine::SamplingParams& params,
                   bool max_tokens_given, int64_t context, ApiKind kind) {
  const auto n = static_cast<int64_t>(prompt.size());
  const char* where = kind == ApiKind::kChat ? "messages" : "prompt";
  // max_tokens 0 (echo) only computes the prompt, which may then fill the context.
  const bool samples_nothing = max_tokens_given && *params.max_tokens == 0;
  if (n > context || (n == context && !samples_nothing)) {
    throw ApiException(
        ApiError{.status = 400,
                 .message = fmt::format(
                     "This model's maximum context length is {} tokens. However, your {} has {} "
                     "tokens, which leaves no room for a completion. Please reduce the length of "
                     "the {}.",
                     context, kind == ApiKind::kChat ? "conversation" : "prompt", n, where),
                 .param = where,
                 .code = "context_length_exceeded"});
  }
  if (max_tokens_given && n + *params.max_tokens > context) {
    throw ApiException(ApiError{
        .status = 400,
        .message = fmt::format(
            "This model's maximum context length is {} tokens. However, you requested {} "
            "tokens ({} in the {}, {} for the completion). Please reduce the length of the "
            "{} or the completion.",
            context, n + *params.max_tokens, n, where, *params.max_tokens, where),
        .param = "max_tokens",
        .code = "context_length_exceeded"});
  }
}

}  // namespace

json parse_request_body(std::string_view text) {
  JsonError error = JsonError::kInvalid;
  std::optional<json> body = parse_json(text, &error);
  if (!body && error == JsonError::kTooDeep) {
    throw_invalid("body", fmt::format("the request body nests arrays and objects deeper than {} "
                                      "levels",
                                      kMaxJsonDepth));
  }
  if (!body) throw_invalid("body", "the request body is not valid JSON (UTF-8)");
  if (!body->is_object()) throw_invalid("body", "the request body must be a JSON object");
  return *std::move(body);
}

std::vector<TokenId> ModelInfo::encode_prompt(std::string_view text,
                                              tok::EncodeOptions options) const {
  return answers ? answers->encode(text, options) : tokenizer->encode(text, options);
}

bool serves_model(const ModelInfo& model, std::string_view name) {
  return name == model.served_name ||
         std::find(model.aliases.begin(), model.aliases.end(), name) != model.aliases.end();
}

void check_model_name(const ModelInfo& model, const std::string& name) {
  if (!serves_model(model, name)) throw ApiException(model_not_found(name));
}

GenerationRequest parse_generation_request(ApiKind kind, const json& body, const ModelInfo& model) {
  if (!body.is_object()) throw_invalid("body", "the request body must be a JSON object");
  GenerationRequest request;
  request.kind = kind;
  request.model = model.served_name;
  if (const json* v = field(body, "model")) {
    request.model = string_of(*v, "model");
    check_model_name(model, request.model);
  }
  reject_unsupported(kind, body);

  parse_sampling(kind, body, model.sampling_defaults, request.params);
  if (const json* v = field(body, "stream")) request.stream = bool_of(*v, "stream");
  if (const json* v = field(body, "stream_options")) {
    if (!request.stream)
      throw_invalid("stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (!v->is_object()) throw_invalid("stream_options", "'stream_options' must be an object");
    if (const json* u = field(*v, "include_usage"))
      request.include_usage = bool_of(*u, "stream_options.include_usage");
    if (const json* u = field(*v, "continuous_usage_stats")) {
      request.continuous_usage = bool_of(*u, "stream_options.continuous_usage_stats");
    }
  }
  if (const json* v = field(body, "user")) request.user = string_of(*v, "user");

  ToolRequest tools;
  if (kind == ApiKind::kCompletion) {
    parse_prompts(body, model, request);
  } else {
    tools = parse_tool_request(body);
    ChatPrompt chat = parse_chat_prompt(body, model, tools.render);
    request.prompts.push_back(std::move(chat.ids));
    request.prompt_texts.push_back(std::move(chat.text));
    request.prompt_encoding = chat.encoding;
  }
  parse_echo(kind, body, *model.tokenizer, request);

  const bool max_tokens_given = request.params.max_tokens.has_value();
  for (const auto& prompt : request.prompts) {
    check_context(prompt, request.params, max_tokens_given, model.context_length, kind);
  }
  if (!max_tokens_given && kind == ApiKind::kCompletion) {
    // The legacy default of 16, cut to what the shortest remaining context allows.
    int64_t room = kCompletionsDefaultMaxTokens;
    for (const auto& prompt : request.prompts)
      room = std::min<int64_t>(room, model.context_length - prompt.size());
    request.params.max_tokens = static_cast<int32_t>(room);
  }
  if (const std::optional<int32_t> cap = model.sampling_defaults.max_new_tokens) {
    request.params.max_tokens = std::min(request.params.max_tokens.value_or(*cap), *cap);
  }
  for (const auto& prompt : request.prompts) {
    const int64_t room = model.context_length - static_cast<int64_t>(prompt.size());
    if (request.params.min_tokens > room) {
      throw_invalid("min_tokens",
                    fmt::format("'min_tokens' ({}) is more than the {} tokens left in the context",
                                request.params.min_tokens, room));
    }
  }
  check_sampling(kind, body, request.params, model.tokenizer->vocab().size());

  request.kv_policy = model.default_kv_policy;
  if (const json* v = field(body, "kv_policy")) {
    // Parsed here so a typo is a 400 naming it; the engine refuses (400) policies it cannot run.
    try {
      request.kv_policy = v->is_string() ? sparsity::parse_policy(v->get<std::string>())
                          : v->is_object()
                              ? sparsity::parse_policy_json(v->dump())
                              : throw Error("'kv_policy' must be a string or an object");
    } catch (const Error& e) {
      throw_invalid("kv_policy", e.what());
    }
  }
  if (const json* v = field(body, "speculative")) {
    // The same keys as --speculative-config; the engine refuses (400) methods it cannot run.
    if (!v->is_object())
      throw_invalid("speculative", "'speculative' must be an object, e.g. {\"method\": \"none\"}");
    try {
      request.speculative = speculative::parse_speculative_config(v->dump());
    } catch (const Error& e) {
      throw_invalid("speculative", e.what());
    }
  }
  // Grammars last: compiling one is the costliest check.
  if (auto constraint = parse_constraint(body))
    request.params.constraint = compile_constraint(*constraint, model);
  if (kind == ApiKind::kChat) apply_tool_choice(tools, model, request);
  return request;
}

std::vector<TokenId> parse_tokenize_request(const json& body, const ModelInfo& model) {
  if (body.contains("messages")) {
    // As /v1/chat/completions prompts the model, however long: a client tokenizes a conversation
    // to learn how much of it to drop (vLLM's /tokenize refuses no length either).
    const ToolRequest tools = parse_tool_request(body);
    return parse_chat_prompt(body, model, tools.render).ids;
  }
  const json* prompt = field(body, "prompt");
  if (!prompt || !prompt->is_string()) throw_invalid("prompt", "'prompt' must be a string");
  bool add_special = true;
  if (const json* v = field(body, "add_special_tokens"))
    add_special = bool_of(*v, "add_special_tokens");
  return model.encode_prompt(prompt->get<std::string>(),
                             {.add_special = add_special, .parse_special = true});
}

std::vector<TokenId> parse_detokenize_request(const json& body, size_t vocab_size) {
  const json* tokens = field(body, "tokens");
  if (!tokens || !tokens->is_array())
    throw_invalid("tokens", "'tokens' must be an array of token ids");
  std::vector<TokenId> ids;
  for (const json& v : *tokens) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() >= static_cast<int64_t>(vocab_size)) {
      throw_invalid("tokens", fmt::format("'tokens' must hold token ids in [0, {})", vocab_size));
    }
    ids.push_back(static_cast<TokenId>(v.get<int64_t>()));
  }
  return ids;
}

}  // namespace sieve::server
