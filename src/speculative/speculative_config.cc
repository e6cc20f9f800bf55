#include "speculative/speculative_config.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace sieve::speculative {

namespace {

using nlohmann::json;

int32_t int_field(const json& object, const char* key, int64_t min, int64_t max) {
  const json& value = object.at(key);
  if (!value.is_number_integer()) fail("speculative_config: \"{}\" must be an integer", key);
  const auto v = value.get<int64_t>();
  if (v < min || v > max)
    fail("speculative_config: \"{}\" is {}, not in [{}, {}]", key, v, min, max);
  return static_cast<int32_t>(v);
}

Method parse_method(const json& value) {
  if (!value.is_string()) fail("speculative_config: \"method\" must be a string");
  const auto name = value.get<std::string>();
  for (Method m : {Method::kNone, Method::kNgram, Method::kSelfSparse, Method::kDraftModel}) {
    if (name == method_name(m)) return m;
  }
  fail("speculative_config: unknown method '{}' (methods: none, ngram, self_sparse, draft_model)",
       name);
}

}  // namespace

std::string_view method_name(Method method) {
  switch (method) {
    case Method::kNone:
      return "none";
    case Method::kNgram:
      return "ngram";
    case Method::kSelfSparse:
      return "self_sparse";
    case Method::kDraftModel:
      return "draft_model";
  }
  return "none";
}

SpeculativeConfig parse_speculative_config(std::string_view json_text) {
  json object;
  try {
    object = json::parse(json_text);
  } catch (const json::exception& e) {
    fail("speculative_config is not valid JSON: {}", e.what());
  }
  if (!object.is_object()) fail("speculative_config must be a JSON object");
  SpeculativeConfig config;
  if (object.empty()) return config;
  for (const auto& [key, value] : object.items()) {
    static constexpr std::string_view kKeys[] = {
        "method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "kv_policy",
        "model",  "disable_by_batch_size",  "adaptive",          "draft_token_cost"};
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) {
      fail(
          "speculative_config: unknown key \"{}\" (keys: method, num_speculative_tokens, "
          "prompt_lookup_max, prompt_lookup_min, kv_policy, model, disable_by_batch_size, "
          "adaptive, draft_token_cost)",
          key);
    }
  }
  if (!object.contains("method")) fail("speculative_config: \"method\" is required");
  config.method = parse_method(object.at("method"));
  if (config.method == Method::kNone) return config;
  if (!object.contains("num_speculative_tokens"))
    fail("speculative_config: \"num_speculative_tokens\" is required");
  config.num_speculative_tokens =
      int_field(object, "num_speculative_tokens", 1, kMaxSpeculativeTokens);
  if (object.contains("disable_by_batch_size"))
    config.disable_by_batch_size = int_field(object, "disable_by_batch_size", 1, 1 << 20);
  if (object.contains("adaptive")) {
    if (!object.at("adaptive").is_boolean())
      fail("speculative_config: \"adaptive\" must be true or false");
    config.adaptive = object.at("adaptive").get<bool>();
  }
  if (object.contains("draft_token_cost")) {
    const json& cost = object.at("draft_token_cost");
    if (!config.adaptive)
      fail("speculative_config: \"draft_token_cost\" is for \"adaptive\": true");
    if (!cost.is_number() || !(cost.get<double>() >= 0.0) || cost.get<double>() > 16.0)
      fail("speculative_config: \"draft_token_cost\" must be a number in [0, 16]");
    config.draft_token_cost = cost.get<double>();
  }

  const bool has_max = object.contains("prompt_lookup_max");
  const bool has_min = object.contains("prompt_lookup_min");
  if ((has_max || has_min) && config.method != Method::kNgram)
    fail("speculative_config: prompt_lookup_max / prompt_lookup_min are for method ngram");
  if (has_max) config.prompt_lookup_max = int_field(object, "prompt_lookup_max", 1, 64);
  if (has_min) config.prompt_lookup_min = int_field(object, "prompt_lookup_min", 1, 64);
  if (has_max && !has_min)
    config.prompt_lookup_min = std::min(config.prompt_lookup_min, config.prompt_lookup_max);
  if (has_min && !has_max)
    config.prompt_lookup_max = std::max(config.prompt_lookup_max, config.prompt_lookup_min);
  if (config.prompt_lookup_min > config.prompt_lookup_max) {
    fail("speculative_config: prompt_lookup_min ({}) exceeds prompt_lookup_max ({})",
         config.prompt_lookup_min, config.prompt_lookup_max);
  }

  if (object.contains("kv_policy")) {
    if (config.method != Method::kSelfSparse)
      fail("speculative_config: \"kv_policy\" is for method self_sparse");
    const json& policy = object.at("kv_policy");
    try {
      config.kv_policy = policy.is_string() ? sparsity::parse_policy(policy.get<std::string>())
                                            : sparsity::parse_policy_json(policy.dump());
    } catch (const Error& e) {
      fail("speculative_config: \"kv_policy\": {}", e.what());
    }
  } else if (config.method == Method::kSelfSparse) {
    config.kv_policy = sparsity::parse_policy("streaming:S=4,W=1020");
  }

  if (object.contains("model")) {
    if (config.method != Method::kDraftModel)
      fail("speculative_config: \"model\" is for method draft_model");
    if (!object.at("model").is_string() || object.at("model").get<std::string>().empty())
      fail("speculative_config: \"model\" must be a GGUF file's path");
    config.model = object.at("model").get<std::string>();
  } else if (config.method == Method::kDraftModel) {
    fail("speculative_config: method draft_model needs \"model\" (the draft GGUF file)");
  }
  return config;
}

std::string to_json(const SpeculativeConfig& config) {
  json object{{"method", method_name(config.method)}};
  if (config.method != Method::kNone)
    object["num_speculative_tokens"] = config.num_speculative_tokens;
  if (config.method == Method::kNgram) {
    object["prompt_lookup_max"] = config.prompt_lookup_max;
    object["prompt_lookup_min"] = config.prompt_lookup_min;
  }
  if (config.method == Method::kSelfSparse)
    object["kv_policy"] = sparsity::to_string(config.kv_policy);
  if (config.method == Method::kDraftModel) object["model"] = config.model;
  if (config.disable_by_batch_size) object["disable_by_batch_size"] = *config.disable_by_batch_size;
  if (config.adaptive) object["adaptive"] = true;
  if (config.draft_token_cost) object["draft_token_cost"] = *config.draft_token_cost;
  return object.dump();
}

}  // namespace sieve::speculative
