// Response objects and stream chunks (api_responses.h), on the real stories260K tokenizer.
#include "server/api_responses.h"

#include <gtest/gtest.h>

#include "model/loader.h"
#include "shared_data.h"

namespace sieve::server {
namespace {

class ApiResponsesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    holder_ = model::load_tokenizer(
        {.model_path = sieve::testing::shared_path("models/stories260K.gguf")});
    tokenizer_ = holder_.get();
  }
  static inline std::shared_ptr<const tok::Tokenizer> holder_;
  static inline const tok::Tokenizer* tokenizer_ = nullptr;
};

// usage.speculative: present when the request speculated (or could have: no draft found).
TEST_F(ApiResponsesTest, UsageReportsSpeculationOnlyWhenOn) {
  UsageTotals usage{.prompt_tokens = 3, .completion_tokens = 9};
  EXPECT_FALSE(usage.to_json().contains("speculative"));
  usage.speculative = true;
  EXPECT_EQ(usage.to_json()["speculative"], json({{"draft_tokens", 0}, {"accepted_tokens", 0}}));
  usage.spec_draft_tokens = 8;
  usage.spec_accepted_tokens = 5;
  EXPECT_EQ(usage.to_json()["speculative"], json({{"draft_tokens", 8}, {"accepted_tokens", 5}}));
}

TEST_F(ApiResponsesTest, ResponseShapes) {
  ResponseWriter completion(ApiKind::kCompletion, "llama", *tokenizer_, /*want_logprobs=*/true);
  std::vector<ChoiceState> choices(1);
  choices[0].text = "Once";
  choices[0].finish = engine::Finish{engine::FinishReason::kLength};
  choices[0].logprobs.push_back({.token = 5, .logprob = -0.5f, .top = {{5, -0.5f}, {6, -1.5f}}});
  const UsageTotals usage{.prompt_tokens = 3, .completion_tokens = 1, .cached_tokens = 2};
  json r = completion.response(choices, usage);
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(r["choices"][0]["text"], "Once");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["choices"][0]["logprobs"]["token_logprobs"][0], -0.5f);
  EXPECT_EQ(r["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(r["choices"][0]["logprobs"]["text_offset"][0], 0);
  EXPECT_EQ(r["usage"]["total_tokens"], 4);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 2);

  ResponseWriter chat(ApiKind::kChat, "llama", *tokenizer_, /*want_logprobs=*/false);
  json role = chat.role_chunk(0);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  size_t offset = 0;
  json last = chat.delta_chunk(0, "", {}, engine::Finish{engine::FinishReason::kStop}, offset);
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  json usage_chunk = chat.usage_chunk(usage);
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], 1);
  json full = chat.response(choices, usage);
  EXPECT_EQ(full["choices"][0]["message"]["content"], "Once");
  EXPECT_TRUE(full["choices"][0]["logprobs"].is_null());
}

// The echoed prompt comes first in the text and the logprobs (the first token's null), and every
// text_offset points where its token's text starts in the choice's text, prompt and completion.
TEST_F(ApiResponsesTest, EchoResponseHasThePromptFirstWithConsistentOffsets) {
  const std::string prompt_text = "Once upon a time";
  const std::vector<TokenId> ids =
      tokenizer_->encode(prompt_text, {.add_special = true, .parse_special = true});
  ASSERT_GT(ids.size(), 3u);
  auto prompt_logprobs = std::make_shared<std::vector<engine::SampleResult>>();
  for (size_t i = 0; i < ids.size(); ++i) {
    engine::SampleResult r{.token = ids[i]};
    if (i > 0) {
      r.logprob = -1.0f - static_cast<float>(i);
      r.top = {{ids[i], *r.logprob}, {7, -9.0f}};
    }
    prompt_logprobs->push_back(r);
  }
  const TokenId there = tokenizer_->encode("there", {.add_special = false})[0];
  const std::string there_piece = tokenizer_->token_to_piece(there);
  std::vector<ChoiceState> choices(1);
  choices[0].echo = Echo{.text = prompt_text, .logprobs = prompt_logprobs};
  choices[0].text = there_piece;
  choices[0].logprobs.push_back({.token = there, .logprob = -0.25f, .top = {{there, -0.25f}}});
  choices[0].finish = engine::Finish{engine::FinishReason::kLength};

  ResponseWriter writer(ApiKind::kCompletion, "llama", *tokenizer_, /*want_logprobs=*/true);
  const json r = writer.response(choices, UsageTotals{});
  const std::string text = r["choices"][0]["text"];
  EXPECT_EQ(text, prompt_text + there_piece);
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size() + 1);
  ASSERT_EQ(lp["text_offset"].size(), ids.size() + 1);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["token_logprobs"][1], -2.0f);
  EXPECT_EQ(lp["top_logprobs"][1].size(), 2u);
  EXPECT_EQ(lp["token_logprobs"][ids.size()], -0.25f);
  // Offsets ascend, and each token's span of the text is its piece (the first word's without the
  // leading space the tokenizer's decode strips; BOS spans nothing).
  std::vector<size_t> offsets = lp["text_offset"].get<std::vector<size_t>>();
  offsets.push_back(text.size());
  EXPECT_EQ(offsets[0], 0u);
  EXPECT_EQ(offsets[ids.size()], prompt_text.size());
  for (size_t i = 0; i <= ids.size(); ++i) {
    ASSERT_LE(offsets[i], offsets[i + 1]) << i;
    const std::string span = text.substr(offsets[i], offsets[i + 1] - offsets[i]);
    const std::string piece = tokenizer_->token_to_piece(i < ids.size() ? ids[i] : there);
    EXPECT_TRUE(span == piece || " " + span == piece)
        << i << ": '" << span << "' / '" << piece << "'";
  }

  // Streaming: the first chunk carries the echo, the next ones continue its offsets.
  size_t offset = 0;
  const json first = writer.delta_chunk(0, "", {}, std::nullopt, offset, &*choices[0].echo);
  EXPECT_EQ(first["choices"][0]["text"], prompt_text);
  EXPECT_EQ(first["choices"][0]["logprobs"]["tokens"].size(), ids.size());
  EXPECT_EQ(offset, prompt_text.size());
  const json next =
      writer.delta_chunk(0, there_piece, choices[0].logprobs, choices[0].finish, offset);
  EXPECT_EQ(next["choices"][0]["logprobs"]["text_offset"][0], prompt_text.size());
  EXPECT_EQ(next["choices"][0]["text"], there_piece);

  // Echo without logprobs: the text only.
  ResponseWriter no_logprobs(ApiKind::kCompletion, "llama", *tokenizer_, false);
  choices[0].echo->logprobs = nullptr;
  const json bare = no_logprobs.response(choices, UsageTotals{});
  EXPECT_EQ(bare["choices"][0]["text"], prompt_text + there_piece);
  EXPECT_TRUE(bare["choices"][0]["logprobs"].is_null());
}

TEST_F(ApiResponsesTest, ModelsAndTokens) {
  const ModelInfo model{
      .served_name = "llama", .aliases = {"tiny"}, .context_length = 512, .tokenizer = tokenizer_};
  const json list = model_list(model);
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 2u);
  EXPECT_EQ(list["data"][0]["id"], "llama");
  EXPECT_EQ(list["data"][1]["id"], "tiny");
  const json card = model_card(model, "tiny");
  EXPECT_EQ(card["object"], "model");
  EXPECT_EQ(card["root"], "llama");
  EXPECT_EQ(card["max_model_len"], 512);
  EXPECT_EQ(tokenize_response({1, 5}, 512),
            json({{"count", 2}, {"max_model_len", 512}, {"tokens", {1, 5}}}));
  EXPECT_EQ(detokenize_response("Once"), json({{"prompt", "Once"}}));
}

}  // namespace
}  // namespace sieve::server
