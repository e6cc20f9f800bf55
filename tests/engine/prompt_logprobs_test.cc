// Prompt logprobs (Request::prompt_logprobs) against one full forward pass of the prompt with
// every position's logits: the same log_softmax at each position whether the prompt runs in one
// chunk or many, after a prefix-cache hit was possible, with n > 1, under preemption, with a
// sparse KV policy or speculative decoding beside it, and with max_tokens 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "model/kv_cache.h"
#include "sparsity/policy_spec.h"
#include "speculative_test_util.h"

namespace sieve::engine {
namespace {

constexpr double kTolerance = 1e-4;

// log_softmax of every position's logits, in double: [position][vocab].
std::vector<std::vector<double>> reference_log_softmax(const model::Model& model,
                                                       const std::vector<TokenId>& prompt) {
  const model::ModelConfig& mc = model.config();
  auto [cache, block_table] =
      model::KvCache::for_one_sequence(model.backend(), mc, static_cast<int32_t>(prompt.size()));
  model::ForwardScratch scratch;
  model::Batch batch;
  batch.begin_sequence(block_table);
  for (size_t j = 0; j < prompt.size(); ++j)
    batch.add(prompt[j], static_cast<int32_t>(j), /*logits=*/true);
  std::vector<float> logits;
  model.forward(batch, cache, scratch, logits);
  const auto vocab = static_cast<size_t>(mc.vocab_size);
  std::vector<std::vector<double>> out(prompt.size());
  for (size_t j = 0; j < prompt.size(); ++j) {
    const float* row = &logits[j * vocab];
    const double max = *std::max_element(row, row + vocab);
    double sum = 0.0;
    for (size_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - max);
    const double lse = max + std::log(sum);
    out[j].resize(vocab);
    for (size_t v = 0; v < vocab; ++v) out[j][v] = row[v] - lse;
  }
  return out;
}

struct Result {
  std::vector<TokenId> tokens;
  std::shared_ptr<const std::vector<SampleResult>> prompt_logprobs;
  int num_events_with_prompt_logprobs = 0;
  std::optional<Finish> finish;
  Usage usage;
};

// Runs the requests; results keyed by (request index, sample index).
std::map<std::pair<size_t, int>, Result> run_all(Engine& engine,
                                                 const std::vector<Request>& requests) {
  std::map<std::pair<size_t, int>, Result> results;
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto submitted = engine.submit(requests[i], [&](const RequestEvent& event) {
      Result& r = results[{index.at(event.request_id), event.sample_idx}];
      EXPECT_FALSE(event.error.has_value()) << *event.error;
      r.tokens.insert(r.tokens.end(), event.tokens.begin(), event.tokens.end());
      if (event.prompt_logprobs) {
        ++r.num_events_with_prompt_logprobs;
        r.prompt_logprobs = event.prompt_logprobs;
      }
      if (event.finish) {
        r.finish = event.finish;
        r.usage = event.usage;
      }
    });
    EXPECT_TRUE(std::holds_alternative<RequestId>(submitted));
    index[std::get<RequestId>(submitted)] = i;
  }
  engine.run_until_idle();
  return results;
}

Request scoring(const std::vector<TokenId>& prompt, int32_t top_n, int32_t max_tokens = 4) {
  Request request = greedy(prompt, max_tokens);
  request.prompt_logprobs = top_n;
  return request;
}

// A long prompt: the first sentences of the TinyStories text.
std::vector<TokenId> long_prompt(const tok::Tokenizer& tokenizer) {
  std::vector<TokenId> prompt;
  for (const auto& p : prompts(tokenizer, 12)) {
    prompt.insert(prompt.end(), p.begin() + (prompt.empty() ? 0 : 1), p.end());  // one BOS
  }
  return prompt;
}

// Every entry equals the reference: the token, its logprob, the top N sorted (largest first)
// with the reference's values, and the token among them when its logprob reaches the N-th.
void expect_matches(const std::vector<SampleResult>& got, const std::vector<TokenId>& prompt,
                    const std::vector<std::vector<double>>& reference, int32_t top_n) {
  ASSERT_EQ(got.size(), prompt.size());
  EXPECT_EQ(got[0].token, prompt[0]);
  EXPECT_FALSE(got[0].logprob.has_value());
  EXPECT_TRUE(got[0].top.empty());
  for (size_t i = 1; i < prompt.size(); ++i) {
    const std::vector<double>& expected = reference[i - 1];
    ASSERT_EQ(got[i].token, prompt[i]) << i;
    ASSERT_TRUE(got[i].logprob.has_value()) << i;
    EXPECT_NEAR(*got[i].logprob, expected[static_cast<size_t>(prompt[i])], kTolerance) << i;
    ASSERT_EQ(got[i].top.size(), static_cast<size_t>(top_n)) << i;
    std::vector<double> sorted = expected;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    bool has_own = false;
    for (size_t k = 0; k < got[i].top.size(); ++k) {
      const TokenLogprob& t = got[i].top[k];
      EXPECT_NEAR(t.logprob, expected[static_cast<size_t>(t.id)], kTolerance) << i;
      EXPECT_NEAR(t.logprob, sorted[k], kTolerance) << i << " rank " << k;
      if (k > 0) {
        EXPECT_GE(got[i].top[k - 1].logprob, t.logprob) << i;
      }
      has_own = has_own || t.id == prompt[i];
    }
    if (top_n > 0 && *got[i].logprob > got[i].top.back().logprob + kTolerance) {
      EXPECT_TRUE(has_own) << "position " << i << ": the token is in the top " << top_n;
    }
  }
}

class PromptLogprobs : public ::testing::Test {
 protected:
  void SetUp() override {
    loaded_ = load_stories();
    prompt_ = long_prompt(*loaded_.tokenizer);
    ASSERT_GT(prompt_.size(), 100u);
    ASSERT_LT(prompt_.size(), 400u);
    reference_ = reference_log_softmax(*loaded_.model, prompt_);
  }
  model::LoadedModel loaded_;
  std::vector<TokenId> prompt_;
  std::vector<std::vector<double>> reference_;
};

TEST_F(PromptLogprobs, OneChunkEqualsAFullForwardPass) {
  Engine engine(config(128, 512), loaded_.model, loaded_.tokenizer);
  auto results = run_all(engine, {scoring(prompt_, 5)});
  const Result& r = results.at({0, 0});
  ASSERT_TRUE(r.prompt_logprobs);
  EXPECT_EQ(r.num_events_with_prompt_logprobs, 1) << "only the first event carries them";
  expect_matches(*r.prompt_logprobs, prompt_, reference_, 5);
  EXPECT_EQ(r.tokens.size(), 4u);
  EXPECT_EQ(engine.stats().num_steps, 4) << "the prompt in one step";
  expect_all_pages_free(engine);
}

TEST_F(PromptLogprobs, ManyChunksEqualAFullForwardPass) {
  for (const int32_t chunk : {16, 23, 64}) {
    Engine engine(config(128, chunk), loaded_.model, loaded_.tokenizer);
    auto results = run_all(engine, {scoring(prompt_, 3)});
    const Result& r = results.at({0, 0});
    ASSERT_TRUE(r.prompt_logprobs) << chunk;
    expect_matches(*r.prompt_logprobs, prompt_, reference_, 3);
    EXPECT_GT(engine.stats().num_steps, static_cast<int64_t>(prompt_.size()) / chunk) << chunk;
    expect_all_pages_free(engine);
  }
}

// Cached prompt tokens have no logits: a request for prompt logprobs computes its whole prompt
// even when the cache holds it, and still publishes it for the next plain request.
TEST_F(PromptLogprobs, SkipPrefixCacheHitsAndStillPublish) {
  Engine engine(config(128, 64), loaded_.model, loaded_.tokenizer);
  const auto plain = run_all(engine, {greedy(prompt_, 4)}).at({0, 0});
  EXPECT_EQ(plain.usage.cached_prompt_tokens, 0);
  const int64_t computed_before = engine.stats().num_prompt_tokens_computed;
  auto scored = run_all(engine, {scoring(prompt_, 2)}).at({0, 0});
  EXPECT_EQ(scored.usage.cached_prompt_tokens, 0);
  EXPECT_EQ(engine.stats().num_prompt_tokens_computed - computed_before,
            static_cast<int64_t>(prompt_.size()));
  ASSERT_TRUE(scored.prompt_logprobs);
  expect_matches(*scored.prompt_logprobs, prompt_, reference_, 2);
  EXPECT_EQ(scored.tokens, plain.tokens);
  const auto again = run_all(engine, {greedy(prompt_, 4)}).at({0, 0});
  EXPECT_GT(again.usage.cached_prompt_tokens, 0);
  EXPECT_EQ(again.tokens, plain.tokens);
  expect_all_pages_free(engine);
}

TEST_F(PromptLogprobs, EverySampleOfNGetsThem) {
  Request request = scoring(prompt_, 4, 8);
  request.params.n = 3;
  request.params.temperature = 0.8f;
  request.params.seed = 7;
  Engine engine(config(128, 48), loaded_.model, loaded_.tokenizer);
  auto results = run_all(engine, {request});
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(engine.stats().num_prompt_tokens_computed, static_cast<int64_t>(prompt_.size()));
  for (int i = 0; i < 3; ++i) {
    const Result& r = results.at({0, i});
    ASSERT_TRUE(r.prompt_logprobs) << i;
    EXPECT_EQ(r.num_events_with_prompt_logprobs, 1) << i;
    expect_matches(*r.prompt_logprobs, prompt_, reference_, 4);
    EXPECT_EQ(r.tokens.size(), 8u);
  }
  // Prompt logprobs change no sample.
  Request plain = request;
  plain.prompt_logprobs.reset();
  Engine other(config(128, 48), loaded_.model, loaded_.tokenizer);
  auto expected = run_all(other, {plain});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(results.at({0, i}).tokens, expected.at({0, i}).tokens);
  expect_all_pages_free(engine);
}

// max_tokens 0 scores the prompt: one event per sample, no token, finish "length".
TEST_F(PromptLogprobs, MaxTokensZeroOnlyScoresThePrompt) {
  Request request = scoring(prompt_, 1, 0);
  request.params.n = 2;
  Engine engine(config(128, 40), loaded_.model, loaded_.tokenizer);
  auto results = run_all(engine, {request, greedy(prompt_, 0)});
  for (int i = 0; i < 2; ++i) {
    const Result& r = results.at({0, i});
    EXPECT_TRUE(r.tokens.empty());
    ASSERT_TRUE(r.finish.has_value());
    EXPECT_EQ(r.finish->reason, FinishReason::kLength);
    EXPECT_EQ(r.usage.completion_tokens, 0);
    EXPECT_EQ(r.usage.prompt_tokens, static_cast<int32_t>(prompt_.size()));
    ASSERT_TRUE(r.prompt_logprobs);
    expect_matches(*r.prompt_logprobs, prompt_, reference_, 1);
  }
  const Result& plain = results.at({1, 0});
  EXPECT_TRUE(plain.tokens.empty());
  EXPECT_FALSE(plain.prompt_logprobs);
  ASSERT_TRUE(plain.finish.has_value());
  EXPECT_EQ(plain.finish->reason, FinishReason::kLength);
  expect_all_pages_free(engine);

  // It may fill the whole context; one more token may not.
  const int32_t context = static_cast<int32_t>(loaded_.model->config().context_length);
  std::vector<TokenId> full(static_cast<size_t>(context), prompt_[1]);
  const EventSink ignore = [](const RequestEvent&) {};
  EXPECT_TRUE(std::holds_alternative<RequestId>(engine.submit(scoring(full, 0, 0), ignore)));
  engine.run_until_idle();
  EXPECT_TRUE(std::holds_alternative<AdmissionError>(engine.submit(scoring(full, 0, 1), ignore)));
  Request bad = scoring(prompt_, kMaxTopLogprobs + 1);
  auto refused = engine.submit(bad, ignore);
  ASSERT_TRUE(std::holds_alternative<AdmissionError>(refused));
  EXPECT_EQ(std::get<AdmissionError>(refused).param, "prompt_logprobs");
}

// A pool too small for everyone: prompts preempted in the middle of their prefill are computed
// again, and their logprobs still come out whole and in order.
TEST_F(PromptLogprobs, PreemptedPrefillsStillGiveEveryPosition) {
  std::vector<std::vector<TokenId>> all = prompts(*loaded_.tokenizer, 12);
  all.push_back(prompt_);
  std::vector<Request> requests;
  for (const auto& p : all) requests.push_back(scoring(p, 2, 24));
  Engine engine(config(24, 32), loaded_.model, loaded_.tokenizer);
  auto results = run_all(engine, requests);
  EXPECT_GT(engine.stats().num_preemptions, 0);
  for (size_t i = 0; i < all.size(); ++i) {
    const Result& r = results.at({i, 0});
    ASSERT_TRUE(r.prompt_logprobs) << i;
    EXPECT_EQ(r.num_events_with_prompt_logprobs, 1) << i;
    expect_matches(*r.prompt_logprobs, all[i], reference_log_softmax(*loaded_.model, all[i]), 2);
  }
  expect_all_pages_free(engine);
}

// Sparse policies compress after the rows were computed: compressed only at the prompt's end,
// every row is dense; chunk by chunk, the first chunk's rows are. The generated tokens are those
// of the same request without prompt logprobs.
TEST_F(PromptLogprobs, SparsePoliciesKeepWorking) {
  struct Case {
    const char* policy;
    int32_t sparse_prefill_chunk;
    size_t dense_entries;  // prompt logprobs computed before any compression
  };
  for (const Case& k :
       {Case{"snapkv:B=32,W=8", 0, prompt_.size()}, Case{"streaming:S=4,W=32", 64, 64}}) {
    const char* policy = k.policy;
    EngineConfig c = config(128, 512);
    c.sparse_prefill_chunk = k.sparse_prefill_chunk;
    Request request = scoring(prompt_, 2, 12);
    request.kv_policy = sparsity::parse_policy(policy);
    Engine engine(c, loaded_.model, loaded_.tokenizer);
    auto results = run_all(engine, {request});
    const Result& r = results.at({0, 0});
    ASSERT_TRUE(r.prompt_logprobs) << policy;
    ASSERT_EQ(r.prompt_logprobs->size(), prompt_.size());
    const size_t dense_rows = k.dense_entries;
    const std::vector<SampleResult> head(r.prompt_logprobs->begin(),
                                         r.prompt_logprobs->begin() + dense_rows);
    expect_matches(head, std::vector<TokenId>(prompt_.begin(), prompt_.begin() + dense_rows),
                   reference_, 2);
    Request plain = request;
    plain.prompt_logprobs.reset();
    Engine other(c, loaded_.model, loaded_.tokenizer);
    EXPECT_EQ(r.tokens, run_all(other, {plain}).at({0, 0}).tokens) << policy;
    expect_all_pages_free(engine);
  }
}

TEST_F(PromptLogprobs, SpeculativeDecodingKeepsWorking) {
  const auto repetitive = repetitive_prompts(*loaded_.tokenizer);
  std::vector<Request> plain = greedy_requests(repetitive, 24);
  std::vector<Request> scored = plain;
  for (Request& r : scored) {
    r.prompt_logprobs = 1;
    r.speculative = ngram(4);
  }
  Engine engine(config(128, 64), loaded_.model, loaded_.tokenizer);
  auto got = run_all(engine, scored);
  Engine other(config(128, 64), loaded_.model, loaded_.tokenizer);
  auto expected = run_all(other, plain);
  for (size_t i = 0; i < repetitive.size(); ++i) {
    const Result& r = got.at({i, 0});
    EXPECT_EQ(r.tokens, expected.at({i, 0}).tokens) << i;
    ASSERT_TRUE(r.prompt_logprobs) << i;
    expect_matches(*r.prompt_logprobs, repetitive[i],
                   reference_log_softmax(*loaded_.model, repetitive[i]), 1);
  }
  EXPECT_GT(engine.stats().spec_num_drafts, 0);
  expect_all_pages_free(engine);
}

}  // namespace
}  // namespace sieve::engine
