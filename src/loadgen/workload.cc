#include "loadgen/workload.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <span>

#include "util/error.h"

namespace sieve::loadgen {

namespace {

// Ordinary text pieces only: no control, byte, unused or empty tokens, which a server would
// render differently or refuse.
std::vector<tok::TokenId> plain_token_ids(const tok::Tokenizer& tokenizer) {
  std::vector<tok::TokenId> ids;
  const tok::Vocab& vocab = tokenizer.vocab();
  for (size_t i = 0; i < vocab.size(); ++i) {
    const tok::TokenType type = vocab.types.empty() ? tok::TokenType::kNormal : vocab.types[i];
    if (type != tok::TokenType::kNormal && type != tok::TokenType::kUndefined) continue;
    const auto id = static_cast<tok::TokenId>(i);
    if (tokenizer.is_eog(id)) continue;
    const std::string piece = tokenizer.token_to_piece(id);
    if (piece.empty() || piece.find('\0') != std::string::npos) continue;
    ids.push_back(id);
  }
  if (ids.empty()) fail("the tokenizer has no ordinary text tokens to build random prompts from");
  return ids;
}

std::vector<tok::TokenId> encode_plain(const tok::Tokenizer& tokenizer, const std::string& text) {
  return tokenizer.encode(text, {.add_special = false, .parse_special = false});
}

int64_t draw_length(int64_t length, double range_ratio, std::mt19937_64& rng) {
  if (range_ratio <= 0) return length;
  const auto low =
      static_cast<int64_t>(std::floor(static_cast<double>(length) * (1.0 - range_ratio)));
  const auto high =
      static_cast<int64_t>(std::ceil(static_cast<double>(length) * (1.0 + range_ratio)));
  return std::uniform_int_distribution<int64_t>(std::max<int64_t>(low, 1),
                                                std::max<int64_t>(high, 1))(rng);
}

std::string random_words(int64_t num_words, std::mt19937_64& rng) {
  static constexpr std::array<const char*, 24> kWords = {
      "the",   "of",    "river", "light", "stone", "quiet", "house",  "under",
      "green", "after", "small", "road",  "water", "field", "north",  "open",
      "music", "paper", "cloud", "early", "story", "table", "winter", "bright"};
  std::uniform_int_distribution<size_t> pick(0, kWords.size() - 1);
  std::string text;
  for (int64_t i = 0; i < num_words; ++i) {
    if (i > 0) text += ' ';
    text += kWords[pick(rng)];
  }
  return text;
}

std::string exact_length_text(const tok::Tokenizer& tokenizer,
                              std::span<const tok::TokenId> candidates, int64_t num_tokens,
                              std::mt19937_64& rng, const std::string& prefix_text) {
  if (num_tokens <= 0) return prefix_text;
  std::uniform_int_distribution<size_t> pick(0, candidates.size() - 1);
  const std::vector<tok::TokenId> prefix_ids = encode_plain(tokenizer, prefix_text);
  const auto target = static_cast<size_t>(num_tokens);
  if (!prefix_text.empty() && prefix_ids.size() >= target) {
    fail("the shared prefix ({} tokens) must be shorter than the prompt ({} tokens)",
         prefix_ids.size(), target);
  }
  // Decoding random ids and encoding the text again merges or splits some pieces, so the count
  // drifts: truncate or top up and repeat until the re-encoded text has the exact length.
  // Top-ups go after the prefix; a truncation that cut into it starts again from the prefix.
  std::vector<tok::TokenId> ids = prefix_ids;
  for (int attempt = 0; attempt < 200; ++attempt) {
    while (ids.size() < target) ids.push_back(candidates[pick(rng)]);
    ids.resize(target);
    const std::string text = tokenizer.decode(ids);
    if (!text.starts_with(prefix_text)) {
      ids = prefix_ids;
      continue;
    }
    ids = encode_plain(tokenizer, text);
    if (ids.size() == target) return text;
  }
  fail("could not build a random prompt of exactly {} tokens from this vocabulary", num_tokens);
}

}  // namespace

std::string exact_length_text(const tok::Tokenizer& tokenizer, int64_t num_tokens,
                              std::mt19937_64& rng, const std::string& prefix_text) {
  return exact_length_text(tokenizer, plain_token_ids(tokenizer), num_tokens, rng, prefix_text);
}

std::vector<Prompt> random_prompts(const tok::Tokenizer* tokenizer,
                                   const RandomWorkload& workload) {
  if (workload.input_len <= 0) fail("--input-len must be positive (got {})", workload.input_len);
  if (workload.output_len <= 0) fail("--output-len must be positive (got {})", workload.output_len);
  if (workload.range_ratio < 0 || workload.range_ratio >= 1) {
    fail("--range-ratio must be in [0, 1) (got {})", workload.range_ratio);
  }
  if (workload.shared_prefix_len < 0) fail("--shared-prefix-len must not be negative");
  if (workload.num_prefixes < 1)
    fail("--num-prefixes must be positive (got {})", workload.num_prefixes);
  const auto min_input =
      static_cast<int64_t>(std::floor(workload.input_len * (1.0 - workload.range_ratio)));
  if (workload.shared_prefix_len > 0 && workload.shared_prefix_len >= min_input) {
    fail("--shared-prefix-len {} must be shorter than the shortest prompt ({} tokens)",
         workload.shared_prefix_len, min_input);
  }
  std::mt19937_64 rng(workload.seed);
  std::vector<tok::TokenId> candidates;
  if (tokenizer) candidates = plain_token_ids(*tokenizer);
  std::vector<std::string> prefixes(static_cast<size_t>(workload.num_prefixes));
  if (workload.shared_prefix_len > 0) {
    for (std::string& prefix : prefixes) {
      prefix = tokenizer
                   ? exact_length_text(*tokenizer, candidates, workload.shared_prefix_len, rng, "")
                   : random_words(workload.shared_prefix_len, rng);
    }
  }
  std::vector<Prompt> prompts;
  prompts.reserve(static_cast<size_t>(std::max<int64_t>(workload.num_prompts, 0)));
  for (int64_t i = 0; i < workload.num_prompts; ++i) {
    // Groups in random order: taking turns (i mod N) would line up with a balancer's own
    // alternation and hand it an affinity it did not choose.
    const std::string& prefix =
        prefixes.size() == 1
            ? prefixes[0]
            : prefixes[std::uniform_int_distribution<size_t>(0, prefixes.size() - 1)(rng)];
    Prompt prompt;
    const int64_t input_len = draw_length(workload.input_len, workload.range_ratio, rng);
    prompt.output_tokens = draw_length(workload.output_len, workload.range_ratio, rng);
    if (tokenizer) {
      prompt.text = exact_length_text(*tokenizer, candidates, input_len, rng, prefix);
      prompt.input_tokens = input_len;
    } else {
      const std::string words = random_words(input_len - workload.shared_prefix_len, rng);
      prompt.text = prefix.empty() ? words : prefix + " " + words;
    }
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

std::vector<Prompt> load_jsonl_prompts(const std::string& path, const DatasetOptions& options,
                                       const tok::Tokenizer* tokenizer) {
  std::ifstream in(path);
  if (!in) fail("cannot open dataset '{}'", path);
  std::vector<Prompt> lines;
  std::string line;
  for (int64_t line_number = 1; std::getline(in, line); ++line_number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("{}:{}: not a JSON object: {}", path, line_number, e.what());
    }
    if (!row.is_object()) fail("{}:{}: expected a JSON object per line", path, line_number);
    Prompt prompt;
    if (row.contains("prompt")) {
      if (!row["prompt"].is_string()) fail("{}:{}: \"prompt\" must be a string", path, line_number);
      prompt.text = row["prompt"].get<std::string>();
      if (tokenizer)
        prompt.input_tokens = static_cast<int64_t>(encode_plain(*tokenizer, prompt.text).size());
    } else if (row.contains("messages")) {
      if (!row["messages"].is_array() || row["messages"].empty()) {
        fail("{}:{}: \"messages\" must be a non-empty array", path, line_number);
      }
      if (options.endpoint == ApiEndpoint::kCompletions) {
        fail("{}:{}: chat \"messages\" need --endpoint chat", path, line_number);
      }
      prompt.messages = row["messages"];
    } else {
      fail("{}:{}: each line needs \"prompt\" or \"messages\"", path, line_number);
    }
    prompt.output_tokens = options.default_output_len;
    for (const char* key : {"output_len", "output_tokens", "max_tokens"}) {
      if (!row.contains(key)) continue;
      if (!row[key].is_number_integer() || row[key].get<int64_t>() <= 0) {
        fail("{}:{}: \"{}\" must be a positive integer", path, line_number, key);
      }
      prompt.output_tokens = row[key].get<int64_t>();
      break;
    }
    lines.push_back(std::move(prompt));
  }
  if (lines.empty()) fail("dataset '{}' has no prompts", path);
  return lines;
}

std::vector<Prompt> cycle_prompts(const std::vector<Prompt>& prompts, int64_t first,
                                  int64_t count) {
  std::vector<Prompt> out;
  if (prompts.empty()) return out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(count, 0)));
  for (int64_t i = 0; i < count; ++i)
    out.push_back(prompts[static_cast<size_t>(first + i) % prompts.size()]);
  return out;
}

}  // namespace sieve::loadgen
