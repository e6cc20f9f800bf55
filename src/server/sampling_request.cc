#include "server/sampling_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <random>
#include <unordered_set>

#include "server/request_fields.h"
#include "util/error.h"

namespace sieve::server {

namespace {

// Largest number of samples per prompt and of stop strings: bound the work one body can ask
// for before the queue limit applies.
constexpr int64_t kMaxN = 128;
constexpr size_t kMaxStopStrings = 64;

float float_of(const json& value, const std::string& param) {
  return static_cast<float>(number_of(value, param));
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
  return stops;
}

// logit_bias: {"token id": bias}. Keys that are not numbers are refused here; ids outside the
// vocabulary and biases outside the range by check_sampling.
void parse_logit_bias(const json& value, engine::SamplingParams& p) {
  if (!value.is_object())
    throw_invalid("logit_bias", "'logit_bias' must be an object of token id -> bias");
  for (const auto& [key, bias] : value.items()) {
    TokenId id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size()) {
      throw_invalid("logit_bias", fmt::format("'logit_bias' key '{}' is not a token id", key));
    }
    p.logit_bias[id] = float_of(bias, "logit_bias");
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
    std::unordered_set<std::string> required;
    if (const json* list = field(schema, "required"); list && list->is_array()) {
      for (const json& name : *list) {
        if (name.is_string()) required.insert(name.get<std::string>());
      }
    }
    for (const auto& [name, sub] : properties->items()) {
      if (!required.contains(name)) {
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

}  // namespace

void parse_sampling(ApiKind kind, const json& body, const hf::GenerationConfig& defaults,
                    engine::SamplingParams& p) {
  p.temperature = defaults.temperature.value_or(1.0f);  // OpenAI's default
  if (defaults.top_p) p.top_p = *defaults.top_p;
  if (defaults.top_k) p.top_k = *defaults.top_k;
  if (defaults.min_p) p.min_p = *defaults.min_p;
  if (defaults.repetition_penalty) p.repetition_penalty = *defaults.repetition_penalty;
  if (const json* v = field(body, "temperature")) p.temperature = float_of(*v, "temperature");
  if (const json* v = field(body, "top_p")) p.top_p = float_of(*v, "top_p");
  if (const json* v = field(body, "top_k")) {
    const int32_t k = int32_of(*v, "top_k");
    p.top_k = k == -1 ? 0 : k;  // -1 and 0 both mean "no limit" (vLLM)
  }
  if (const json* v = field(body, "min_p")) p.min_p = float_of(*v, "min_p");
  if (const json* v = field(body, "presence_penalty"))
    p.presence_penalty = float_of(*v, "presence_penalty");
  if (const json* v = field(body, "frequency_penalty"))
    p.frequency_penalty = float_of(*v, "frequency_penalty");
  if (const json* v = field(body, "repetition_penalty"))
    p.repetition_penalty = float_of(*v, "repetition_penalty");
  if (const json* v = field(body, "logit_bias")) parse_logit_bias(*v, p);
  if (const json* v = field(body, "seed")) {
    p.seed = static_cast<uint64_t>(integer_of(*v, "seed"));
  } else {
    p.seed = std::random_device{}();
  }
  if (const json* v = field(body, "n")) {
    p.n = int32_of(*v, "n");
    if (p.n > kMaxN) throw_invalid("n", fmt::format("'n' must be at most {}, got {}", kMaxN, p.n));
  }
  if (const json* v = field(body, "best_of")) {
    if (integer_of(*v, "best_of") != p.n)
      throw_invalid("best_of", "'best_of' other than n is not supported");
  }
  if (const json* v = field(body, "stop")) p.stop_strings = parse_stop(*v);
  if (const json* v = field(body, "stop_token_ids")) {
    if (!v->is_array())
      throw_invalid("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    for (const json& id : *v) p.stop_token_ids.push_back(int32_of(id, "stop_token_ids"));
  }
  if (const json* v = field(body, "ignore_eos")) p.ignore_eos = bool_of(*v, "ignore_eos");
  if (!p.ignore_eos) {
    for (TokenId id : defaults.eos_token_ids) {
      if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), id) == p.stop_token_ids.end())
        p.stop_token_ids.push_back(id);
    }
  }
  if (const json* v = field(body, "include_stop_str_in_output")) {
    p.include_stop_str_in_output = bool_of(*v, "include_stop_str_in_output");
  }

  // Length: max_completion_tokens (chat) wins over the older max_tokens.
  if (const json* v = field(body, "max_tokens")) p.max_tokens = int32_of(*v, "max_tokens");
  if (const json* v = field(body, "max_completion_tokens"))
    p.max_tokens = int32_of(*v, "max_completion_tokens");
  if (const json* v = field(body, "min_tokens")) p.min_tokens = int32_of(*v, "min_tokens");

  // Logprobs: completions take a count; chat takes a flag plus top_logprobs.
  if (kind == ApiKind::kCompletion) {
    if (const json* v = field(body, "logprobs")) p.logprobs = int32_of(*v, "logprobs");
  } else {
    const json* flag = field(body, "logprobs");
    const bool want = flag && bool_of(*flag, "logprobs");
    if (const json* v = field(body, "top_logprobs")) {
      const int32_t top = int32_of(*v, "top_logprobs");
      if (!want && top != 0)
        throw_invalid("top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
      if (want) p.logprobs = top;
    } else if (want) {
      p.logprobs = 0;
    }
  }
}

void check_sampling(ApiKind kind, const json& body, const engine::SamplingParams& p,
                    size_t vocab_size) {
  auto problem = engine::check_sampling_params(p, static_cast<int32_t>(vocab_size));
  if (!problem) return;
  ApiError error = admission_api_error(*problem);
  if (error.param == "logprobs" && kind == ApiKind::kChat) error.param = "top_logprobs";
  if (error.param == "max_tokens" && field(body, "max_completion_tokens"))
    error.param = "max_completion_tokens";
  throw ApiException(std::move(error));
}

std::optional<Constraint> parse_constraint(const json& body) {
  std::optional<Constraint> out;
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

// The first mask is made here too, on the request's handler thread: a schema's cold trie walks
// then cost the engine loop nothing.
std::shared_ptr<const grammar::TokenMasker> compile_constraint(const Constraint& constraint,
                                                               const ModelInfo& model) {
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

}  // namespace sieve::server
