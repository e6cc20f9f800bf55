#include "speculative/speculative_config.h"

#include <gtest/gtest.h>

#include "util/error.h"

namespace sieve::speculative {
namespace {

TEST(SpeculativeConfig, ParsesVllmStyleNgram) {
  const SpeculativeConfig c = parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3})");
  EXPECT_EQ(c.method, Method::kNgram);
  EXPECT_EQ(c.num_speculative_tokens, 5);
  EXPECT_EQ(c.prompt_lookup_max, 3);
  EXPECT_EQ(c.prompt_lookup_min, 1);
  EXPECT_TRUE(c.enabled());
  EXPECT_EQ(parse_speculative_config(to_json(c)), c);
}

TEST(SpeculativeConfig, SelfSparseDefaultsToAStreamingDraftAndDraftModelNeedsAFile) {
  const SpeculativeConfig self = parse_speculative_config(
      R"({"method": "self_sparse", "num_speculative_tokens": 4, "disable_by_batch_size": 8})");
  EXPECT_EQ(self.method, Method::kSelfSparse);
  EXPECT_EQ(sparsity::to_string(self.kv_policy), "streaming:S=4,W=1020");
  EXPECT_EQ(self.disable_by_batch_size, 8);
  EXPECT_EQ(parse_speculative_config(to_json(self)), self);
  const SpeculativeConfig quest = parse_speculative_config(
      R"({"method": "self_sparse", "num_speculative_tokens": 2, "kv_policy": "quest:K=64"})");
  EXPECT_EQ(parse_speculative_config(to_json(quest)), quest);
  const SpeculativeConfig draft = parse_speculative_config(
      R"({"method": "draft_model", "num_speculative_tokens": 3, "model": "d.gguf"})");
  EXPECT_EQ(draft.model, "d.gguf");
  EXPECT_THROW(
      parse_speculative_config(R"({"method": "draft_model", "num_speculative_tokens": 3})"), Error);
}

TEST(SpeculativeConfig, AdaptiveIsABooleanForEveryMethod) {
  EXPECT_FALSE(
      parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 4})").adaptive);
  for (const char* json :
       {R"({"method": "ngram", "num_speculative_tokens": 8, "adaptive": true})",
        R"({"method": "self_sparse", "num_speculative_tokens": 8, "adaptive": true})",
        R"({"method": "draft_model", "num_speculative_tokens": 8, "model": "d.gguf",
            "adaptive": true})"}) {
    const SpeculativeConfig c = parse_speculative_config(json);
    EXPECT_TRUE(c.adaptive) << json;
    EXPECT_EQ(c.num_speculative_tokens, 8);
    EXPECT_EQ(parse_speculative_config(to_json(c)), c) << to_json(c);
  }
  try {
    parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 4, "adaptive": 1})");
    ADD_FAILURE() << "adaptive: 1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"adaptive\""), std::string::npos) << e.what();
  }
}

TEST(SpeculativeConfig, DraftTokenCostPinsAdaptivesCost) {
  const SpeculativeConfig c = parse_speculative_config(
      R"({"method": "self_sparse", "num_speculative_tokens": 8, "adaptive": true,
          "draft_token_cost": 0.5})");
  ASSERT_TRUE(c.draft_token_cost.has_value());
  EXPECT_EQ(*c.draft_token_cost, 0.5);
  EXPECT_EQ(parse_speculative_config(to_json(c)), c) << to_json(c);
  EXPECT_FALSE(parse_speculative_config(
                   R"({"method": "ngram", "num_speculative_tokens": 4, "adaptive": true})")
                   .draft_token_cost.has_value());
  for (const char* bad :
       {R"({"method": "ngram", "num_speculative_tokens": 4, "draft_token_cost": 0.2})",
        R"({"method": "ngram", "num_speculative_tokens": 4, "adaptive": true,
            "draft_token_cost": -1})",
        R"({"method": "ngram", "num_speculative_tokens": 4, "adaptive": true,
            "draft_token_cost": "0.2"})"}) {
    try {
      parse_speculative_config(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("\"draft_token_cost\""), std::string::npos) << e.what();
    }
  }
}

TEST(SpeculativeConfig, NoneOrEmptyTurnsItOff) {
  EXPECT_FALSE(parse_speculative_config("{}").enabled());
  EXPECT_FALSE(parse_speculative_config(R"({"method": "none"})").enabled());
}

TEST(SpeculativeConfig, BadInputNamesTheKey) {
  auto message = [](const char* json) {
    try {
      parse_speculative_config(json);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("[1]").find("object"), std::string::npos);
  EXPECT_NE(message("{").find("JSON"), std::string::npos);
  EXPECT_NE(message(R"({"method": "eagle", "num_speculative_tokens": 2})").find("eagle"),
            std::string::npos);
  EXPECT_NE(message(R"({"method": "ngram"})").find("num_speculative_tokens"), std::string::npos);
  EXPECT_NE(
      message(R"({"method": "ngram", "num_speculative_tokens": 0})").find("num_speculative_tokens"),
      std::string::npos);
  EXPECT_NE(message(R"({"method": "ngram", "num_speculative_tokens": 99})").find("[1, 16]"),
            std::string::npos);
  EXPECT_NE(message(R"({"method": "ngram", "num_speculative_tokens": 2, "k": 1})").find("\"k\""),
            std::string::npos);
  EXPECT_NE(message(R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5,
                        "prompt_lookup_max": 2})")
                .find("prompt_lookup_min"),
            std::string::npos);
  EXPECT_NE(message(R"({"method": "ngram", "num_speculative_tokens": 2, "kv_policy": "full"})")
                .find("kv_policy"),
            std::string::npos);
  EXPECT_NE(message(R"({"method": "self_sparse", "num_speculative_tokens": 2,
                        "kv_policy": "nonsense"})")
                .find("kv_policy"),
            std::string::npos);
}

}  // namespace
}  // namespace sieve::speculative
