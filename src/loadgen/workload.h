#pragma once
// What the benchmark sends: prompts with their requested output lengths, either random text of
// exact token lengths built from a tokenizer's vocabulary, or lines of a JSONL dataset.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace sieve::loadgen {

enum class ApiEndpoint { kCompletions, kChat };

struct Prompt {
  std::string text;                        // the completions prompt, or the user message for chat
  std::optional<nlohmann::json> messages;  // chat messages from a dataset, sent as they are
  std::optional<int64_t> input_tokens;     // known when a tokenizer built or counted the prompt
  int64_t output_tokens = 0;               // max_tokens to ask for
};

struct RandomWorkload {
  int64_t input_len = 1024;  // tokens per prompt, as the tokenizer encodes it without BOS
  int64_t output_len = 128;
  // Lengths are drawn uniformly from [len * (1 - r), len * (1 + r)]; 0 gives exact lengths.
  double range_ratio = 0.0;
  // The first tokens of every prompt are the same text (for prefix caches); part of input_len.
  int64_t shared_prefix_len = 0;
  int64_t num_prompts = 0;
  uint64_t seed = 0;
  // With a shared prefix: how many different prefixes; each prompt starts with one of them,
  // drawn at random (groups of requests sharing a system prompt, for prefix-affinity routing).
  int64_t num_prefixes = 1;
};

// With a tokenizer, each prompt re-encodes (without BOS/EOS) to exactly its input length.
// Without one, prompts are random words and their token counts are unknown (about one token
// per word on common tokenizers). Throws sieve::Error on inconsistent lengths.
std::vector<Prompt> random_prompts(const tok::Tokenizer* tokenizer, const RandomWorkload& workload);

// Text of random vocabulary pieces that encodes (add_special = false) to exactly num_tokens
// tokens and starts with prefix_text (which must itself encode to fewer tokens).
std::string exact_length_text(const tok::Tokenizer& tokenizer, int64_t num_tokens,
                              std::mt19937_64& rng, const std::string& prefix_text = "");

struct DatasetOptions {
  int64_t default_output_len = 128;  // for lines without an output length
  ApiEndpoint endpoint = ApiEndpoint::kCompletions;
};

// One JSON object per line: {"prompt": "..."} or {"messages": [...]}, optionally with
// "output_len" (or "output_tokens", "max_tokens"); blank lines are skipped. Chat messages cannot
// be sent to /v1/completions. Returns every line's prompt, in order. Throws sieve::Error naming
// the file and line on bad input, or when there is no prompt.
std::vector<Prompt> load_jsonl_prompts(const std::string& path, const DatasetOptions& options,
                                       const tok::Tokenizer* tokenizer);

// count prompts from position first on, going round when the end is reached.
std::vector<Prompt> cycle_prompts(const std::vector<Prompt>& prompts, int64_t first, int64_t count);

}  // namespace sieve::loadgen
