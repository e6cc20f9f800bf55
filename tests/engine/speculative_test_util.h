#pragma once
// Helpers of the speculative-decoding engine tests (speculative_engine_test.cc,
// draft_model_test.cc).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "speculative/speculative_config.h"

namespace sieve::engine {

inline speculative::SpeculativeConfig ngram(int32_t k, int32_t max_n = 4, int32_t min_n = 1) {
  return {.method = speculative::Method::kNgram,
          .num_speculative_tokens = k,
          .prompt_lookup_max = max_n,
          .prompt_lookup_min = min_n};
}

// Prompts that repeat themselves, so that prompt lookup has something to find.
inline std::vector<std::vector<TokenId>> repetitive_prompts(const tok::Tokenizer& tokenizer) {
  std::vector<std::vector<TokenId>> out;
  for (const char* text :
       {"Lily and Tom went to the park. Lily and Tom went to the park. Lily and",
        "One, two, three, four. One, two, three, four. One, two,",
        "The cat sat on the mat. The dog sat on the mat. The cat sat on the",
        "Once upon a time there was a little girl. Once upon a time there was"}) {
    out.push_back(tokenizer.encode(text));
  }
  return out;
}

inline std::vector<Request> greedy_requests(const std::vector<std::vector<TokenId>>& prompts,
                                            int32_t max_tokens) {
  std::vector<Request> requests;
  for (const auto& p : prompts) requests.push_back(greedy(p, max_tokens));
  return requests;
}

// Speculation must not change a token, the text or how a request ended.
inline void expect_same_tokens(const std::map<std::pair<size_t, int>, Outcome>& got,
                               const std::map<std::pair<size_t, int>, Outcome>& expected) {
  ASSERT_EQ(got.size(), expected.size());
  for (const auto& [key, outcome] : expected) {
    EXPECT_EQ(got.at(key).tokens, outcome.tokens) << "request " << key.first << " " << key.second;
    EXPECT_EQ(got.at(key).text, outcome.text) << "request " << key.first << " " << key.second;
    ASSERT_TRUE(got.at(key).finish.has_value());
    EXPECT_EQ(got.at(key).finish->reason, outcome.finish->reason) << "request " << key.first;
    EXPECT_EQ(got.at(key).usage.completion_tokens, outcome.usage.completion_tokens);
  }
}

}  // namespace sieve::engine
