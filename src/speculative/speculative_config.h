#pragma once
// Speculative decoding, as a server or a request asks for it. The JSON follows vLLM's
// --speculative-config:
//
//   {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min":
//   1}
//   {"method": "self_sparse", "num_speculative_tokens": 4, "kv_policy": "streaming:S=4,W=1020"}
//   {"method": "draft_model", "num_speculative_tokens": 4, "model": "draft.gguf"}
//
// plus "disable_by_batch_size": N (vLLM's name): no sequence speculates in a step that runs at
// least N sequences, where decode is compute-bound and verifying drafts costs more than it saves.
// "adaptive": true (not a vLLM key; transformers calls the idea a "heuristic" assistant-token
// schedule): each sequence's k moves in [0, num_speculative_tokens] with its recent acceptance
// and the measured cost of a draft token (speculative/draft_length.h), or with "draft_token_cost":
// c given (the same for every machine); false (default): k = num_speculative_tokens. "method":
// "none" (or an empty object) turns speculation off, e.g. for one request of a server that
// speculates. Unknown keys and out-of-range values are errors naming the key.
//
// Defaults: num_speculative_tokens is required (1..kMaxSpeculativeTokens); prompt_lookup_max 4
// and prompt_lookup_min 1 (when only one is given, the other is clamped to it); self_sparse's
// kv_policy streaming:S=4,W=1020 (or quest:K=..: speculative/self_sparse_view.h).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sparsity/policy_spec.h"

namespace sieve::speculative {

inline constexpr int32_t kMaxSpeculativeTokens = 16;

enum class Method {
  kNone,
  kNgram,       // prompt lookup: continue the latest earlier occurrence of the last n tokens
  kSelfSparse,  // the target model reading a sparse view of its own KV drafts
  kDraftModel,  // a smaller model with the same vocabulary drafts
};

struct SpeculativeConfig {
  Method method = Method::kNone;
  int32_t num_speculative_tokens = 0;
  int32_t prompt_lookup_max = 4;
  int32_t prompt_lookup_min = 1;
  sparsity::PolicySpec kv_policy;  // self_sparse's draft view
  std::string model;               // draft_model's GGUF file
  std::optional<int32_t> disable_by_batch_size;
  bool adaptive = false;  // k from recent acceptance, at most num_speculative_tokens
  // adaptive's c (speculative/draft_length.h) when set; otherwise measured as the engine runs
  // (speculative/step_cost.h). Fixed, k depends on the tokens alone, not on the machine's speed.
  std::optional<double> draft_token_cost;
  bool enabled() const { return method != Method::kNone && num_speculative_tokens > 0; }
  bool operator==(const SpeculativeConfig&) const = default;
};

// Throws sieve::Error naming the key on invalid input.
SpeculativeConfig parse_speculative_config(std::string_view json_text);
std::string_view method_name(Method method);
// Canonical JSON (the keys that apply to the method).
std::string to_json(const SpeculativeConfig& config);

}  // namespace sieve::speculative
