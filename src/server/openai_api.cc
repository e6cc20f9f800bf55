#include "server/openai_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>

#include "sparsity/policy_spec.h"
#include "util/error.h"

namespace sieve::server {

namespace {

// Largest numbers of prompts per request and samples per prompt: bounds the work one body
// can ask for before the queue limit applies.
constexpr size_t kMaxPrompts = 256;
constexpr int64_t kMaxN = 128;
constexpr size_t kMaxStopStrings = 64;
constexpr int64_t kCompletionsDefaultMaxTokens = 16;  // OpenAI's legacy default

const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

double number_of(const json& value, const std::string& param) {
  if (!value.is_number()) throw_invalid(param, fmt::format("'{}' must be a number", param));
  const double x = value.get<double>();
  if (!std::isfinite(x)) throw_invalid(param, fmt::format("'{}' must be a finite number", param));
  return x;
}

int64_t integer_of(const json& value, const std::string& param) {
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw_invalid(param, fmt::format("'{}' is too large", param));
    }
    return static_cast<int64_t>(value.get<uint64_t>());
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    // 16.0 is accepted as 16 (as pydantic does); 16.5 is not.
    const double x = value.get<double>();
    if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) <= 9007199254740992.0)
      return static_cast<int64_t>(x);
  }
  throw_invalid(param, fmt::format("'{}' must be an integer", param));
}

bool bool_of(const json& value, const std::string& param) {
  if (!value.is_boolean()) throw_invalid(param, fmt::format("'{}' must be a boolean", param));
  return value.get<bool>();
}

std::string string_of(const json& value, const std::string& param) {
  if (!value.is_string()) throw_invalid(param, fmt::format("'{}' must be a string", param));
  return value.get<std::string>();
}

void check_range(double x, double lo, double hi, const std::string& param) {
  if (x < lo || x > hi)
    throw_invalid(param, fmt::format("'{}' must be in [{}, {}], got {}", param, lo, hi, x));
}

int64_t integer_in(const json& value, int64_t lo, int64_t hi, const std::string& param) {
  const int64_t x = integer_of(value, param);
  if (x < lo || x > hi)
    throw_invalid(param, fmt::format("'{}' must be in [{}, {}], got {}", param, lo, hi, x));
  return x;
}

TokenId token_id_of(const json& value, const std::string& param, size_t vocab_size) {
  const int64_t id = integer_of(value, param);
  if (id < 0 || id >= static_cast<int64_t>(vocab_size)) {
    throw_invalid(param, fmt::format("token id {} in '{}' is outside the vocabulary (0..{})", id,
                                     param, vocab_size - 1));
  }
  return static_cast<TokenId>(id);
}

std::vector<TokenId> token_array(const json& array, const std::string& param, size_t vocab_size) {
  std::vector<TokenId> ids;
  ids.reserve(array.size());
  for (const json& v : array) ids.push_back(token_id_of(v, param, vocab_size));
  return ids;
}

// prompt: a string, an array of strings, an array of token ids, or an array of those arrays.
std::vector<std::vector<TokenId>> parse_prompts(const json& body, const tok::Tokenizer& tokenizer) {
  const json* prompt = field(body, "prompt");
  if (!prompt) throw_invalid("prompt", "'prompt' is required");
  const size_t vocab = tokenizer.vocab().size();
  const tok::EncodeOptions encode{.add_special = true, .parse_special = true};
  std::vector<std::vector<TokenId>> prompts;
  if (prompt->is_string()) {
    prompts.push_back(tokenizer.encode(prompt->get<std::string>(), encode));
  } else if (prompt->is_array()) {
    if (prompt->empty()) throw_invalid("prompt", "'prompt' must not be empty");
    const json& first = prompt->front();
    if (first.is_number()) {
      prompts.push_back(token_array(*prompt, "prompt", vocab));
    } else {
      if (prompt->size() > kMaxPrompts)
        throw_invalid("prompt", fmt::format("at most {} prompts per request", kMaxPrompts));
      for (const json& item : *prompt) {
        if (item.is_string()) {
          prompts.push_back(tokenizer.encode(item.get<std::string>(), encode));
        } else if (item.is_array()) {
          prompts.push_back(token_array(item, "prompt", vocab));
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
  return prompts;
}

std::shared_ptr<const grammar::TokenMasker> compile_constraint(
    const std::pair<std::string, grammar::GrammarSpec>& constraint, const ModelInfo& model);

// tools, tool_choice and parallel_tool_calls, validated.
struct ToolRequest {
  enum class Choice { kNone, kAuto, kRequired, kNamed };
  std::vector<ToolFunction> functions;
  Choice choice = Choice::kAuto;
  std::string named;  // kNamed: the function
  bool parallel = true;
  // What the template gets as `tools` (the request's own objects); null: none. tool_choice
  // "none" renders no tools (vLLM's --exclude-tools-when-tool-choice-none), so the model is not
  // prompted to write calls that would come back as text.
  const json* render = nullptr;
};

bool valid_function_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

ToolRequest parse_tool_request(const json& body) {
  ToolRequest tools;
  const json* list = field(body, "tools");
  if (list) {
    if (!list->is_array()) throw_invalid("tools", "'tools' must be an array");
    for (size_t i = 0; i < list->size(); ++i) {
      const json& tool = (*list)[i];
      const std::string where = fmt::format("tools[{}]", i);
      if (!tool.is_object()) throw_invalid(where, fmt::format("'{}' must be an object", where));
      const json* type = field(tool, "type");
      if (!type || string_of(*type, where + ".type") != "function") {
        throw_invalid(where + ".type", fmt::format("'{}.type' must be \"function\"", where));
      }
      const json* function = field(tool, "function");
      if (!function || !function->is_object()) {
        throw_invalid(where + ".function", fmt::format("'{}.function' must be an object", where));
      }
      const json* name = field(*function, "name");
      if (!name) throw_invalid(where + ".function.name", "a function needs a 'name'");
      ToolFunction f{.name = string_of(*name, where + ".function.name")};
      if (!valid_function_name(f.name)) {
        throw_invalid(
            where + ".function.name",
            fmt::format("function name '{}' must be 1 to 64 of a-z, A-Z, 0-9, _ and -", f.name));
      }
      for (const ToolFunction& other : tools.functions) {
        if (other.name == f.name) {
          throw_invalid(where + ".function.name",
                        fmt::format("function '{}' is defined twice", f.name));
        }
      }
      if (const json* d = field(*function, "description")) {
        string_of(*d, where + ".function.description");
      }
      if (const json* p = field(*function, "parameters")) {
        if (!p->is_object()) {
          throw_invalid(
              where + ".function.parameters",
              fmt::format("'{}.function.parameters' must be a JSON Schema object", where));
        }
        f.parameters = *p;
      }
      tools.functions.push_back(std::move(f));
    }
  }
  if (const json* v = field(body, "parallel_tool_calls")) {
    tools.parallel = bool_of(*v, "parallel_tool_calls");
  }
  if (const json* choice = field(body, "tool_choice")) {
    if (choice->is_string()) {
      const std::string mode = choice->get<std::string>();
      if (mode == "none") {
        tools.choice = ToolRequest::Choice::kNone;
      } else if (mode == "auto") {
        tools.choice = ToolRequest::Choice::kAuto;
      } else if (mode == "required") {
        tools.choice = ToolRequest::Choice::kRequired;
      } else {
        throw_invalid("tool_choice", fmt::format("'tool_choice' must be \"none\", \"auto\", "
                                                 "\"required\" or a function, got \"{}\"",
                                                 mode));
      }
    } else if (choice->is_object()) {
      const json* type = field(*choice, "type");
      const json* function = field(*choice, "function");
      if (!type || string_of(*type, "tool_choice.type") != "function" || !function ||
          !function->is_object() || !field(*function, "name")) {
        throw_invalid("tool_choice",
                      "a named 'tool_choice' is {\"type\": \"function\", \"function\": "
                      "{\"name\": ...}}");
      }
      tools.choice = ToolRequest::Choice::kNamed;
      tools.named = string_of(*field(*function, "name"), "tool_choice.function.name");
    } else {
      throw_invalid("tool_choice", "'tool_choice' must be a string or an object");
    }
  }
  const bool forced =
      tools.choice == ToolRequest::Choice::kRequired || tools.choice == ToolRequest::Choice::kNamed;
  if (forced && tools.functions.empty()) {
    throw_invalid("tool_choice", "'tool_choice' asks for a tool call but 'tools' has none");
  }
  if (tools.choice == ToolRequest::Choice::kNamed) {
    bool found = false;
    for (const ToolFunction& f : tools.functions) found = found || f.name == tools.named;
    if (!found) {
      throw_invalid(
          "tool_choice",
          fmt::format("'tool_choice' names function '{}', which is not in 'tools'", tools.named));
    }
  }
  if (!tools.functions.empty() && tools.choice != ToolRequest::Choice::kNone) tools.render = list;
  return tools;
}

// How the output of a chat request with tools is read, and for tool_choice "required" or a named
// function the grammar that forces the call(s).
void apply_tool_choice(const ToolRequest& tools, const ModelInfo& model,
                       GenerationRequest& request) {
  if (!tools.render) return;
  const bool forced =
      tools.choice == ToolRequest::Choice::kRequired || tools.choice == ToolRequest::Choice::kNamed;
  if (model.tool_call_format == ToolCallFormat::kNone) {
    if (forced) {
      throw_invalid("tool_choice",
                    "this server reads no tool calls from this model's output (its chat template "
                    "is of no known tool-calling family): start it with --tool-call-parser");
    }
    return;  // the tools are rendered; the output is plain content
  }
  request.tool_calls = {.format = model.tool_call_format, .constrained = forced};
  if (!forced) return;
  if (!model.grammars) {
    throw_invalid("tool_choice", "constrained decoding is not available on this server");
  }
  if (request.params.constraint) {
    throw_invalid("tool_choice",
                  "a 'tool_choice' that forces a call cannot be combined with another constraint "
                  "(response_format, grammar)");
  }
  std::vector<ToolFunction> allowed;
  for (const ToolFunction& f : tools.functions) {
    if (tools.choice == ToolRequest::Choice::kRequired || f.name == tools.named)
      allowed.push_back(f);
  }
  // A named function is called once; "required" makes one call, or several when parallel.
  const bool parallel = tools.choice == ToolRequest::Choice::kRequired && tools.parallel;
  std::string gbnf;
  try {
    gbnf = tool_call_gbnf(model.tool_call_format, allowed, parallel);
  } catch (const Error& e) {
    throw_invalid(
        "tools", fmt::format("cannot constrain the output to the tools' parameters: {}", e.what()));
  }
  request.params.constraint =
      compile_constraint({"tools", {grammar::GrammarKind::kGbnf, std::move(gbnf)}}, model);
}

// An assistant message's tool_calls as the templates want them: the arguments object itself
// (OpenAI sends it as a JSON string; Llama 3.1's and Qwen2.5's templates print it with tojson).
json tool_calls_for_template(const json& calls, const std::string& where) {
  if (!calls.is_array()) throw_invalid(where, fmt::format("'{}' must be an array", where));
  json out = calls;
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", where, i);
    if (!calls[i].is_object()) throw_invalid(at, fmt::format("'{}' must be an object", at));
    const json* function = field(calls[i], "function");
    if (!function || !function->is_object()) {
      throw_invalid(at + ".function", fmt::format("'{}.function' must be an object", at));
    }
    const json* name = field(*function, "name");
    if (!name) throw_invalid(at + ".function.name", "a tool call needs a function 'name'");
    string_of(*name, at + ".function.name");
    if (const json* id = field(calls[i], "id")) string_of(*id, at + ".id");
    const json* arguments = field(*function, "arguments");
    json& target = out[i]["function"]["arguments"];
    if (!arguments) {
      target = json::object();
    } else if (arguments->is_string()) {
      target = json::parse(arguments->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (target.is_discarded()) {
        throw_invalid(at + ".function.arguments",
                      fmt::format("'{}.function.arguments' is not valid JSON", at));
      }
    } else if (!arguments->is_object()) {
      throw_invalid(at + ".function.arguments",
                    fmt::format("'{}.function.arguments' must be a JSON string", at));
    }
  }
  return out;
}

std::vector<TokenId> parse_chat_prompt(const json& body, const ModelInfo& model,
                                       const json* tools) {
  const json* messages = field(body, "messages");
  if (!messages) throw_invalid("messages", "'messages' is required");
  if (!messages->is_array()) throw_invalid("messages", "'messages' must be an array");
  if (messages->empty()) throw_invalid("messages", "'messages' must not be empty");
  bool add_generation_prompt = true;  // vLLM's extension; OpenAI always adds it
  if (const json* v = field(body, "add_generation_prompt"))
    add_generation_prompt = bool_of(*v, "add_generation_prompt");
  json context = chat_template_context(*messages, add_generation_prompt, *model.tokenizer);
  if (tools) context["tools"] = *tools;
  // vLLM's extension: extra template variables, e.g. {"enable_thinking": false} for Qwen3.
  if (const json* kwargs = field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object())
      throw_invalid("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    for (const auto& [key, value] : kwargs->items()) {
      if (key == "messages" || key == "add_generation_prompt") {
        throw_invalid(
            "chat_template_kwargs",
            fmt::format("'chat_template_kwargs' cannot set '{}': it has its own field", key));
      }
      context[key] = value;
    }
  }
  std::string text;
  try {
    text = model.render_chat(context);
  } catch (const Error& e) {
    throw_invalid("messages", fmt::format("the chat template rejected the messages: {}", e.what()));
  }
  const tok::Tokenizer& tokenizer = *model.tokenizer;
  std::vector<TokenId> ids = tokenizer.encode(text, {.add_special = false, .parse_special = true});
  // Templates usually write the BOS token themselves; add it (as llama.cpp does) when the
  // vocabulary wants one and the template did not.
  const auto& v = tokenizer.vocab();
  if (v.add_bos && v.bos && (ids.empty() || ids.front() != *v.bos)) ids.insert(ids.begin(), *v.bos);
  if (ids.empty()) throw_invalid("messages", "the rendered conversation is empty");
  return ids;
}

std::vector<std::string> parse_stop(const json& value) {
  std::vector<std::string> stops;
  if (value.is_string()) {
    stops.push_back(value.get<std::string>());
  } else if (value.is_array()) {
    if (value.size() > kMaxStopStrings)
      throw_invalid("stop", fmt::format("at most {} stop strings", kMaxStopStrings));
    for (const json& s : value) stops.push_back(string_of(s, "stop"));
  } else {
    throw_invalid("stop", "'stop' must be a string or an array of strings");
  }
  for (const auto& s : stops) {
    if (s.empty()) throw_invalid("stop", "stop strings must not be empty");
  }
  return stops;
}

void parse_sampling(ApiKind kind, const json& body, size_t vocab_size, engine::SamplingParams& p) {
  if (const json* v = field(body, "temperature")) {
    p.temperature = static_cast<float>(number_of(*v, "temperature"));
    check_range(p.temperature, 0.0, 100.0, "temperature");
  } else {
    p.temperature = 1.0f;  // OpenAI's default
  }
  if (const json* v = field(body, "top_p")) {
    const double x = number_of(*v, "top_p");
    if (!(x > 0.0 && x <= 1.0))
      throw_invalid("top_p", fmt::format("'top_p' must be in (0, 1], got {}", x));
    p.top_p = static_cast<float>(x);
  }
  if (const json* v = field(body, "top_k")) {
    const int64_t k = integer_in(*v, -1, std::numeric_limits<int32_t>::max(), "top_k");
    p.top_k = k <= 0 ? 0 : static_cast<int32_t>(k);  // -1 and 0 both mean "no limit" (vLLM)
  }
  if (const json* v = field(body, "min_p")) {
    p.min_p = static_cast<float>(number_of(*v, "min_p"));
    check_range(p.min_p, 0.0, 1.0, "min_p");
  }
  if (const json* v = field(body, "presence_penalty")) {
    p.presence_penalty = static_cast<float>(number_of(*v, "presence_penalty"));
    check_range(p.presence_penalty, -2.0, 2.0, "presence_penalty");
  }
  if (const json* v = field(body, "frequency_penalty")) {
    p.frequency_penalty = static_cast<float>(number_of(*v, "frequency_penalty"));
    check_range(p.frequency_penalty, -2.0, 2.0, "frequency_penalty");
  }
  if (const json* v = field(body, "repetition_penalty")) {
    const double x = number_of(*v, "repetition_penalty");
    if (!(x > 0.0 && x <= 100.0))
      throw_invalid("repetition_penalty",
                    fmt::format("'repetition_penalty' must be in (0, 100], got {}", x));
    p.repetition_penalty = static_cast<float>(x);
  }
  if (const json* v = field(body, "logit_bias")) {
    if (!v->is_object())
      throw_invalid("logit_bias", "'logit_bias' must be an object of token id -> bias");
    for (const auto& [key, bias] : v->items()) {
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0 ||
          id >= static_cast<int64_t>(vocab_size)) {
        throw_invalid("logit_bias",
                      fmt::format("'logit_bias' key '{}' is not a token id of this model (0..{})",
                                  key, vocab_size - 1));
      }
      const double b = number_of(bias, "logit_bias");
      check_range(b, -100.0, 100.0, "logit_bias");
      p.logit_bias[static_cast<TokenId>(id)] = static_cast<float>(b);
    }
  }
  if (const json* v = field(body, "seed")) {
    p.seed = static_cast<uint64_t>(integer_of(*v, "seed"));
  } else {
    p.seed = std::random_device{}();
  }
  if (const json* v = field(body, "n")) p.n = static_cast<int32_t>(integer_in(*v, 1, kMaxN, "n"));
  if (const json* v = field(body, "best_of")) {
    if (integer_of(*v, "best_of") != p.n)
      throw_invalid("best_of", "'best_of' other than n is not supported");
  }
  if (const json* v = field(body, "stop")) p.stop_strings = parse_stop(*v);
  if (const json* v = field(body, "stop_token_ids")) {
    if (!v->is_array())
      throw_invalid("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    p.stop_token_ids = token_array(*v, "stop_token_ids", vocab_size);
  }
  if (const json* v = field(body, "ignore_eos")) p.ignore_eos = bool_of(*v, "ignore_eos");
  if (const json* v = field(body, "include_stop_str_in_output")) {
    p.include_stop_str_in_output = bool_of(*v, "include_stop_str_in_output");
  }

  // Length: max_completion_tokens (chat) wins over the older max_tokens.
  std::optional<int64_t> max_tokens;
  if (const json* v = field(body, "max_tokens"))
    max_tokens = integer_in(*v, 0, std::numeric_limits<int32_t>::max(), "max_tokens");
  if (const json* v = field(body, "max_completion_tokens")) {
    max_tokens = integer_in(*v, 0, std::numeric_limits<int32_t>::max(), "max_completion_tokens");
  }
  if (max_tokens) p.max_tokens = static_cast<int32_t>(*max_tokens);
  if (const json* v = field(body, "min_tokens")) {
    p.min_tokens =
        static_cast<int32_t>(integer_in(*v, 0, std::numeric_limits<int32_t>::max(), "min_tokens"));
    if (p.max_tokens && p.min_tokens > *p.max_tokens) {
      throw_invalid("min_tokens", fmt::format("'min_tokens' ({}) must not exceed max_tokens ({})",
                                              p.min_tokens, *p.max_tokens));
    }
  }

  // Logprobs: completions take a count; chat takes a flag plus top_logprobs.
  if (kind == ApiKind::kCompletion) {
    if (const json* v = field(body, "logprobs")) {
      p.logprobs = static_cast<int32_t>(integer_in(*v, 0, engine::kMaxTopLogprobs, "logprobs"));
    }
  } else {
    const json* flag = field(body, "logprobs");
    const bool want = flag && bool_of(*flag, "logprobs");
    if (const json* v = field(body, "top_logprobs")) {
      const int32_t top =
          static_cast<int32_t>(integer_in(*v, 0, engine::kMaxTopLogprobs, "top_logprobs"));
      if (!want && top > 0)
        throw_invalid("top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
      if (want) p.logprobs = top;
    } else if (want) {
      p.logprobs = 0;
    }
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

// OpenAI's strict mode (structured outputs): every object schema lists all its properties in
// `required` and sets additionalProperties to false. OpenAI refuses other schemas with strict
// set, and so does sieve, naming where the rule is broken.
void check_strict_schema(const json& schema, const std::string& where) {
  if (schema.is_array()) {
    for (size_t i = 0; i < schema.size(); ++i)
      check_strict_schema(schema[i], fmt::format("{}/{}", where, i));
    return;
  }
  if (!schema.is_object()) return;
  const json* properties = field(schema, "properties");
  if (properties && properties->is_object()) {
    const json* additional = field(schema, "additionalProperties");
    if (!additional || *additional != false) {
      throw_invalid("response_format",
                    fmt::format("strict json_schema: 'additionalProperties' must be false at "
                                "'{}' (or set \"strict\": false)",
                                where));
    }
    const json* required = field(schema, "required");
    for (const auto& [name, sub] : properties->items()) {
      const bool listed =
          required && required->is_array() &&
          std::find(required->begin(), required->end(), json(name)) != required->end();
      if (!listed) {
        throw_invalid("response_format",
                      fmt::format("strict json_schema: property '{}' at '{}' must be in "
                                  "'required' (or set \"strict\": false)",
                                  name, where));
      }
    }
  }
  for (const auto& [key, sub] : schema.items()) {
    if (key == "enum" || key == "const" || key == "default" || key == "examples") continue;
    check_strict_schema(sub, where + "/" + key);
  }
}

// What to constrain the output to: response_format (json_object, json_schema) or llama.cpp's
// `grammar` (GBNF text); nullopt for free text. Parameter errors are 400s naming the field.
std::optional<std::pair<std::string, grammar::GrammarSpec>> parse_constraint(const json& body) {
  std::optional<std::pair<std::string, grammar::GrammarSpec>> out;
  if (const json* v = field(body, "response_format")) {
    if (!v->is_object()) throw_invalid("response_format", "'response_format' must be an object");
    const json* type = field(*v, "type");
    if (!type) throw_invalid("response_format", "'response_format.type' is required");
    const std::string name = string_of(*type, "response_format.type");
    if (name == "json_object") {
      out.emplace("response_format", grammar::GrammarSpec{grammar::GrammarKind::kJsonObject, ""});
    } else if (name == "json_schema") {
      const json* spec = field(*v, "json_schema");
      if (!spec || !spec->is_object()) {
        throw_invalid("response_format",
                      "response_format type 'json_schema' needs a 'json_schema' object with "
                      "'name' and 'schema'");
      }
      const json* schema = field(*spec, "schema");
      if (!schema)
        throw_invalid("response_format", "'response_format.json_schema.schema' is required");
      if (!schema->is_object() && !schema->is_boolean())
        throw_invalid("response_format", "'response_format.json_schema.schema' must be an object");
      if (const json* strict = field(*spec, "strict");
          strict && bool_of(*strict, "response_format.json_schema.strict")) {
        check_strict_schema(*schema, "#");
      }
      out.emplace("response_format",
                  grammar::GrammarSpec{grammar::GrammarKind::kJsonSchema, schema->dump()});
    } else if (name != "text") {
      throw_invalid("response_format",
                    fmt::format("response_format type must be 'text', 'json_object' or "
                                "'json_schema', got '{}'",
                                name));
    }
  }
  if (const json* v = field(body, "grammar")) {
    if (out) throw_invalid("grammar", "'grammar' and 'response_format' cannot be combined");
    const std::string text = string_of(*v, "grammar");
    if (!text.empty())
      out.emplace("grammar", grammar::GrammarSpec{grammar::GrammarKind::kGbnf, text});
  }
  return out;
}

// Compiles (or finds in the cache) the request's grammar. The first mask is made here too, on
// the request's handler thread: a schema's cold trie walks then cost the engine loop nothing.
std::shared_ptr<const grammar::TokenMasker> compile_constraint(
    const std::pair<std::string, grammar::GrammarSpec>& constraint, const ModelInfo& model) {
  const auto& [param, spec] = constraint;
  if (!model.grammars) throw_invalid(param, "constrained decoding is not available on this server");
  std::shared_ptr<const grammar::TokenMasker> masker;
  try {
    masker = model.grammars->get(spec);
    grammar::TokenBitset first_mask;
    masker->fill_mask(masker->new_state(), first_mask);
  } catch (const Error& e) {
    throw_invalid(param, e.what());
  }
  return masker;
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

std::string random_hex(size_t digits) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string out;
  while (out.size() < digits) out += fmt::format("{:016x}", rng());
  out.resize(digits);
  return out;
}

}  // namespace

json ApiError::to_json() const {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param ? json(*param) : json(nullptr)},
            {"code", code ? json(*code) : json(nullptr)}}}};
}

void throw_invalid(std::string param, std::string message) {
  throw ApiException(
      ApiError{.status = 400, .message = std::move(message), .param = std::move(param)});
}

json chat_template_context(const json& messages, bool add_generation_prompt,
                           const tok::Tokenizer& tokenizer) {
  json flat = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) throw_invalid(where, fmt::format("'{}' must be an object", where));
    const json* role = field(m, "role");
    if (!role) throw_invalid(where + ".role", fmt::format("'{}.role' is required", where));
    string_of(*role, where + ".role");
    json message = m;
    if (const json* calls = field(m, "tool_calls")) {
      message["tool_calls"] = tool_calls_for_template(*calls, where + ".tool_calls");
    }
    if (const json* id = field(m, "tool_call_id")) string_of(*id, where + ".tool_call_id");
    const json* content = field(m, "content");
    if (!content) {
      message["content"] = "";
    } else if (content->is_array()) {
      // Content parts: text parts are joined with newlines, as vLLM does.
      std::string text;
      for (size_t j = 0; j < content->size(); ++j) {
        const json& part = (*content)[j];
        const std::string part_where = fmt::format("{}.content[{}]", where, j);
        if (!part.is_object())
          throw_invalid(part_where, fmt::format("'{}' must be an object", part_where));
        const json* type = field(part, "type");
        if (!type || string_of(*type, part_where + ".type") != "text") {
          throw_invalid(part_where, "only text content parts are supported");
        }
        const json* part_text = field(part, "text");
        if (!part_text) throw_invalid(part_where + ".text", "a text content part needs 'text'");
        if (!text.empty()) text += '\n';
        text += string_of(*part_text, part_where + ".text");
      }
      message["content"] = text;
    } else if (!content->is_string()) {
      throw_invalid(
          where + ".content",
          fmt::format("'{}.content' must be a string or an array of content parts", where));
    }
    flat.push_back(std::move(message));
  }
  const auto& v = tokenizer.vocab();
  return {{"messages", std::move(flat)},
          {"add_generation_prompt", add_generation_prompt},
          {"bos_token", v.bos ? tokenizer.token_to_piece(*v.bos, true) : ""},
          {"eos_token", v.eos ? tokenizer.token_to_piece(*v.eos, true) : ""}};
}

GenerationRequest parse_generation_request(ApiKind kind, const json& body, const ModelInfo& model) {
  if (!body.is_object()) throw_invalid("body", "the request body must be a JSON object");
  std::string model_name = model.served_name;
  if (const json* v = field(body, "model")) {
    const std::string name = string_of(*v, "model");
    if (name != model.served_name &&
        std::find(model.aliases.begin(), model.aliases.end(), name) == model.aliases.end()) {
      throw ApiException(ApiError{.status = 404,
                                  .message = fmt::format("The model `{}` does not exist.", name),
                                  .type = "NotFoundError",
                                  .param = "model",
                                  .code = "model_not_found"});
    }
    model_name = name;
  }
  reject_unsupported(kind, body);

  GenerationRequest request;
  request.kind = kind;
  request.model = std::move(model_name);
  const size_t vocab = model.tokenizer->vocab().size();
  parse_sampling(kind, body, vocab, request.params);
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
  if (auto constraint = parse_constraint(body))
    request.params.constraint = compile_constraint(*constraint, model);
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

  if (kind == ApiKind::kCompletion) {
    request.prompts = parse_prompts(body, *model.tokenizer);
  } else {
    const ToolRequest tools = parse_tool_request(body);
    request.prompts.push_back(parse_chat_prompt(body, model, tools.render));
    apply_tool_choice(tools, model, request);
  }
  parse_echo(kind, body, *model.tokenizer, request);

  const bool max_tokens_given = request.params.max_tokens.has_value();
  for (const auto& prompt : request.prompts) {
    engine::SamplingParams& p = request.params;
    check_context(prompt, p, max_tokens_given, model.context_length, kind);
  }
  if (!max_tokens_given && kind == ApiKind::kCompletion) {
    // The legacy default of 16, cut to what the shortest remaining context allows.
    int64_t room = kCompletionsDefaultMaxTokens;
    for (const auto& prompt : request.prompts)
      room = std::min<int64_t>(room, model.context_length - prompt.size());
    request.params.max_tokens = static_cast<int32_t>(room);
  }
  for (const auto& prompt : request.prompts) {
    const int64_t room = model.context_length - static_cast<int64_t>(prompt.size());
    if (request.params.min_tokens > room) {
      throw_invalid("min_tokens",
                    fmt::format("'min_tokens' ({}) is more than the {} tokens left in the context",
                                request.params.min_tokens, room));
    }
  }
  if (request.params.max_tokens && request.params.min_tokens > *request.params.max_tokens) {
    throw_invalid("min_tokens", fmt::format("'min_tokens' ({}) must not exceed max_tokens ({})",
                                            request.params.min_tokens, *request.params.max_tokens));
  }
  if (auto problem = engine::check_sampling_params(request.params, static_cast<int32_t>(vocab))) {
    throw ApiException(admission_api_error(*problem));
  }
  return request;
}

json UsageTotals::to_json() const {
  // sieve's extension: KV memory kept against a dense cache (sparsity's saving).
  json kv_cache = {{"pages", kv_pages},
                   {"dense_pages", kv_dense_pages},
                   {"bytes", kv_bytes},
                   {"dense_bytes", kv_dense_bytes}};
  if (recovery_count > 0) kv_cache["attention_recovery"] = recovery_sum / recovery_count;
  json out = {{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}},
              {"kv_cache", std::move(kv_cache)}};
  if (speculative || spec_draft_tokens > 0) {
    out["speculative"] = {{"draft_tokens", spec_draft_tokens},
                          {"accepted_tokens", spec_accepted_tokens}};
  }
  return out;
}

json finish_reason_json(const std::optional<engine::Finish>& finish) {
  if (!finish) return nullptr;
  return std::string(engine::finish_reason_name(finish->reason));
}

json stop_reason_json(const std::optional<engine::Finish>& finish) {
  if (!finish) return nullptr;
  if (const auto* id = std::get_if<TokenId>(&finish->matched)) return *id;
  if (const auto* s = std::get_if<std::string>(&finish->matched)) return *s;
  return nullptr;
}

ApiError admission_api_error(const engine::AdmissionError& refusal) {
  ApiError error{.status = 400, .message = refusal.message, .param = refusal.param};
  switch (refusal.kind) {
    case engine::AdmissionError::Kind::kQueueFull:
      error.status = 503;
      error.type = "server_overloaded";
      error.code = "queue_full";
      break;
    case engine::AdmissionError::Kind::kTooLong:
      error.code = "context_length_exceeded";
      break;
    case engine::AdmissionError::Kind::kNeverFits:
      error.code = "kv_cache_too_small";
      break;
    case engine::AdmissionError::Kind::kInvalidParams:
      break;
  }
  return error;
}

ResponseWriter::ResponseWriter(ApiKind kind, std::string model_name,
                               const tok::Tokenizer& tokenizer, bool want_logprobs,
                               ToolCallOptions tool_calls)
    : kind_(kind),
      model_(std::move(model_name)),
      tokenizer_(tokenizer),
      want_logprobs_(want_logprobs),
      tool_calls_(tool_calls),
      id_((kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-") + random_hex(24)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count()) {}

json ResponseWriter::base(std::string_view object) const {
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

json ResponseWriter::logprobs_json(std::span<const engine::SampleResult> logprobs,
                                   size_t& offset) const {
  if (!want_logprobs_) return nullptr;
  auto bytes_of = [](const std::string& piece) {
    json b = json::array();
    for (unsigned char c : piece) b.push_back(static_cast<int>(c));
    return b;
  };
  if (kind_ == ApiKind::kChat) {
    json content = json::array();
    for (const engine::SampleResult& r : logprobs) {
      const std::string piece = tokenizer_.token_to_piece(r.token, true);
      json top = json::array();
      for (const engine::TokenLogprob& t : r.top) {
        const std::string p = tokenizer_.token_to_piece(t.id, true);
        top.push_back({{"token", p}, {"logprob", t.logprob}, {"bytes", bytes_of(p)}});
      }
      content.push_back({{"token", piece},
                         {"logprob", r.logprob.value_or(0.0f)},
                         {"bytes", bytes_of(piece)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       offsets = json::array();
  for (const engine::SampleResult& r : logprobs) {
    const std::string piece = tokenizer_.token_to_piece(r.token, true);
    tokens.push_back(piece);
    token_logprobs.push_back(r.logprob.value_or(0.0f));
    // As vLLM: the sampled token is always among its top_logprobs.
    json top = json::object();
    for (const engine::TokenLogprob& t : r.top)
      top[tokenizer_.token_to_piece(t.id, true)] = t.logprob;
    top[piece] = r.logprob.value_or(0.0f);
    top_logprobs.push_back(std::move(top));
    offsets.push_back(offset);
    offset += piece.size();
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

json ResponseWriter::echo_logprobs_json(const Echo& echo,
                                        std::span<const engine::SampleResult> logprobs,
                                        size_t& offset) const {
  if (!want_logprobs_ || !echo.logprobs) return logprobs_json(logprobs, offset);
  const std::vector<engine::SampleResult>& prompt = *echo.logprobs;
  // A prompt token's offset is where its text starts in echo.text: the pieces before it, less the
  // leading space an SPM tokenizer's decode strips (the first piece's, or the second's after
  // BOS); clamped to the text for a prompt that does not decode to itself (control tokens
  // written in it).
  std::vector<TokenId> ids;
  for (const engine::SampleResult& r : prompt) ids.push_back(r.token);
  size_t pieces = 0;
  for (TokenId id : ids) pieces += tokenizer_.token_to_piece(id).size();
  const size_t stripped = pieces - std::min(pieces, tokenizer_.decode(ids).size());
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       offsets = json::array();
  size_t before = 0;
  for (const engine::SampleResult& r : prompt) {
    const std::string piece = tokenizer_.token_to_piece(r.token, true);
    tokens.push_back(piece);
    offsets.push_back(std::min(echo.text.size(), before - std::min(before, stripped)));
    before += tokenizer_.token_to_piece(r.token).size();
    if (!r.logprob) {  // the first token: nothing came before it
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(*r.logprob);
    json top = json::object();
    for (const engine::TokenLogprob& t : r.top)
      top[tokenizer_.token_to_piece(t.id, true)] = t.logprob;
    top[piece] = *r.logprob;
    top_logprobs.push_back(std::move(top));
  }
  offset = echo.text.size();
  json own = logprobs_json(logprobs, offset);
  auto append = [&own](json& head, const char* key) {
    for (json& v : own[key]) head.push_back(std::move(v));
    return std::move(head);
  };
  return {{"tokens", append(tokens, "tokens")},
          {"token_logprobs", append(token_logprobs, "token_logprobs")},
          {"top_logprobs", append(top_logprobs, "top_logprobs")},
          {"text_offset", append(offsets, "text_offset")}};
}

json ResponseWriter::response(const std::vector<ChoiceState>& choices,
                              const UsageTotals& usage) const {
  json out = base(kind_ == ApiKind::kChat ? "chat.completion" : "text_completion");
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceState& c = choices[i];
    size_t offset = 0;
    json choice = {{"index", i}};
    json finish_reason = finish_reason_json(c.finish);
    if (kind_ == ApiKind::kChat && tool_calls_.format != ToolCallFormat::kNone) {
      ParsedToolCalls parsed = parse_tool_calls(tool_calls_, c.text);
      json message = {{"role", "assistant"},
                      {"content", parsed.content ? json(*parsed.content) : json(nullptr)}};
      if (!parsed.calls.empty()) {
        json calls = json::array();
        for (const ToolCall& call : parsed.calls) calls.push_back(tool_call_json(call));
        message["tool_calls"] = std::move(calls);
        finish_reason = "tool_calls";
      }
      choice["message"] = std::move(message);
    } else if (kind_ == ApiKind::kChat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.echo ? c.echo->text + c.text : c.text;
    }
    choice["logprobs"] = c.echo ? echo_logprobs_json(*c.echo, c.logprobs, offset)
                                : logprobs_json(c.logprobs, offset);
    choice["finish_reason"] = std::move(finish_reason);
    choice["stop_reason"] = stop_reason_json(c.finish);
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] = usage.to_json();
  return out;
}

json ResponseWriter::role_chunk(int32_t index) const {
  json out = base("chat.completion.chunk");
  out["choices"] = json::array({{{"index", index},
                                 {"delta", {{"role", "assistant"}, {"content", ""}}},
                                 {"logprobs", nullptr},
                                 {"finish_reason", nullptr}}});
  return out;
}

json ResponseWriter::delta_chunk(int32_t index, const std::string& text,
                                 std::span<const engine::SampleResult> logprobs,
                                 const std::optional<engine::Finish>& finish, size_t& offset,
                                 const Echo* echo) const {
  json choice = {{"index", index}};
  if (kind_ == ApiKind::kChat) {
    choice["delta"] = text.empty() && finish ? json::object() : json{{"content", text}};
  } else {
    choice["text"] = echo ? echo->text + text : text;
  }
  choice["logprobs"] = echo               ? echo_logprobs_json(*echo, logprobs, offset)
                       : logprobs.empty() ? json(nullptr)
                                          : logprobs_json(logprobs, offset);
  choice["finish_reason"] = finish_reason_json(finish);
  if (finish) choice["stop_reason"] = stop_reason_json(finish);
  json out = base(kind_ == ApiKind::kChat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = json::array({std::move(choice)});
  return out;
}

std::vector<json> ResponseWriter::tool_delta_chunks(ChoiceState& choice, int32_t index,
                                                    const std::string& text,
                                                    std::span<const engine::SampleResult> logprobs,
                                                    const std::optional<engine::Finish>& finish,
                                                    size_t& offset) const {
  ToolCallParser& parser = *choice.tool_parser;
  ToolCallDelta delta = parser.push(text);
  if (finish) {
    ToolCallDelta rest = parser.finish();
    delta.content += rest.content;
    for (ToolCall& call : rest.calls) delta.calls.push_back(std::move(call));
  }
  std::vector<json> deltas;
  if (!delta.content.empty() || (!logprobs.empty() && delta.calls.empty())) {
    deltas.push_back({{"content", delta.content}});
  }
  const size_t first_index = parser.num_calls() - delta.calls.size();
  for (size_t i = 0; i < delta.calls.size(); ++i) {
    const ToolCall& call = delta.calls[i];
    const size_t call_index = first_index + i;
    deltas.push_back(
        {{"tool_calls", json::array({{{"index", call_index},
                                      {"id", call.id},
                                      {"type", "function"},
                                      {"function", {{"name", call.name}, {"arguments", ""}}}}})}});
    deltas.push_back(
        {{"tool_calls",
          json::array({{{"index", call_index}, {"function", {{"arguments", call.arguments}}}}})}});
  }
  if (deltas.empty() && finish) deltas.push_back(json::object());
  std::vector<json> chunks;
  for (size_t i = 0; i < deltas.size(); ++i) {
    json c = {{"index", index}, {"delta", std::move(deltas[i])}};
    c["logprobs"] = i == 0 && !logprobs.empty() ? logprobs_json(logprobs, offset) : json(nullptr);
    const bool last = i + 1 == deltas.size();
    c["finish_reason"] = nullptr;
    if (last && finish) {
      c["finish_reason"] = parser.num_calls() > 0 ? json("tool_calls") : finish_reason_json(finish);
      c["stop_reason"] = stop_reason_json(finish);
    }
    json out = base("chat.completion.chunk");
    out["choices"] = json::array({std::move(c)});
    chunks.push_back(std::move(out));
  }
  return chunks;
}

json ResponseWriter::usage_chunk(const UsageTotals& usage) const {
  json out = base(kind_ == ApiKind::kChat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = json::array();
  out["usage"] = usage.to_json();
  return out;
}

}  // namespace sieve::server
