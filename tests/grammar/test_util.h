#pragma once
// Helpers for the grammar tests: the shared vocabularies, the brute-force mask the fast one must
// equal, and random walks through the masks.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "gguf/gguf.h"
#include "grammar/token_masker.h"
#include "grammar/vocabulary.h"
#include "shared_data.h"
#include "tokenizer/tokenizer.h"

namespace sieve::grammar::testing {

// shared/golden/tokenizer/ggml-vocab-<name>.gguf, loaded once per test binary.
inline std::shared_ptr<const Vocabulary> golden_vocabulary(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const Vocabulary>> cache;
  auto& slot = cache[name];
  if (!slot) {
    const std::string path =
        sieve::testing::shared_path("golden/tokenizer/ggml-vocab-" + name + ".gguf");
    const auto tokenizer = tok::Tokenizer::create(tok::load_vocab(gguf::File::open(path)));
    slot = Vocabulary::from_tokenizer(*tokenizer);
  }
  return slot;
}

// The two vocabularies the masks are checked on: SentencePiece (32000 tokens, byte fallback)
// and byte-level BPE (DeepSeek LLM, 102400 tokens; the largest in shared/).
inline const char* const kVocabularies[] = {"llama-spm", "deepseek-llm"};

// Every token tried from a copy of the state.
inline TokenBitset brute_force_mask(const Vocabulary& v, const GrammarState& state) {
  TokenBitset mask(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const auto id = static_cast<TokenId>(i);
    if (v.is_eog(id)) {
      if (state.can_end()) mask.set(i);
    } else if (v.is_text(id)) {
      GrammarState fork = state.fork();
      if (fork.accept_bytes(v.token_bytes(id))) mask.set(i);
    }
  }
  return mask;
}

// Long runs: SIEVE_GRAMMAR_FUZZ=N multiplies the iteration counts.
inline int fuzz_scale() {
  const char* env = std::getenv("SIEVE_GRAMMAR_FUZZ");
  return env ? std::max(1, std::atoi(env)) : 1;
}

inline std::vector<TokenId> allowed_ids(const TokenBitset& mask) {
  std::vector<TokenId> ids;
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask.test(i)) ids.push_back(static_cast<TokenId>(i));
  }
  return ids;
}

struct WalkResult {
  std::string text;
  bool ended = false;  // EOS was chosen
  size_t num_steps = 0;
};

// Samples tokens from the masks until EOS (or max_steps). After soft_limit steps it steers
// towards an end: EOS when allowed, else a token holding one of `closers` when one is allowed.
// Checks on every step that the mask is not empty and that the chosen token is accepted.
inline WalkResult random_walk(const TokenMasker& masker, std::mt19937& rng, size_t max_steps,
                              size_t soft_limit, std::string_view closers = "}]\"",
                              double eos_probability = 0.3) {
  const Vocabulary& v = masker.vocabulary();
  GrammarState state = masker.new_state();
  WalkResult result;
  TokenBitset mask;
  for (; result.num_steps < max_steps; ++result.num_steps) {
    const size_t count = masker.fill_mask(state, mask);
    EXPECT_GT(count, 0u) << "dead end after " << result.text;
    if (count == 0) return result;
    std::vector<TokenId> ids = allowed_ids(mask);
    const bool may_end = state.can_end();
    EXPECT_EQ(may_end, mask.test(static_cast<size_t>(v.eog_ids()[0])));
    std::uniform_real_distribution<double> coin(0, 1);
    if (may_end && (coin(rng) < eos_probability || result.num_steps >= soft_limit)) {
      result.ended = true;
      return result;
    }
    std::vector<TokenId> text_ids;
    std::vector<TokenId> closing;
    for (TokenId id : ids) {
      if (v.is_eog(id)) continue;
      text_ids.push_back(id);
      if (v.token_bytes(id).find_first_of(closers) != std::string_view::npos) {
        closing.push_back(id);
      }
    }
    if (text_ids.empty()) {
      EXPECT_TRUE(may_end);
      result.ended = true;
      return result;
    }
    const std::vector<TokenId>& pool =
        result.num_steps >= soft_limit && !closing.empty() ? closing : text_ids;
    const TokenId id = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
    EXPECT_TRUE(masker.accept_token(state, id)) << "token " << id;
    result.text += v.token_bytes(id);
  }
  return result;
}

}  // namespace sieve::grammar::testing
