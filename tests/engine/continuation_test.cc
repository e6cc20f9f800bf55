// Conversations on a compressed cache: a request whose prompt extends a finished request's prompt
// + output, under the same sparse policy, continues from its parked K/V and controller. Defined
// by, and checked against, one sequence that prefills turn 1, takes turn 1's output as given and
// then prefills the new tokens (Request::given_output / then_prompt), run in a fresh engine:
// tokens and logprobs equal, for every policy and KV dtype. Parked pages are taken back before
// anyone is preempted, within their share of the pool, and never leak.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "kv_dtype_cases.h"
#include "model/loader.h"
#include "shared_data.h"
#include "sparsity/calibration.h"
#include "sparsity/policy_spec.h"
#include "speculative/speculative_config.h"

namespace sieve::engine {
namespace {

// One request through the engine: its first sample's outcome.
Outcome run_one(Engine& engine, const Request& request) {
  return run(engine, {request}).at({0, 0});
}

Request greedy(std::vector<TokenId> prompt, const std::string& policy, int32_t max_tokens) {
  Request request{.prompt = std::move(prompt), .kv_policy = sparsity::parse_policy(policy)};
  request.params.max_tokens = max_tokens;
  request.params.ignore_eos = true;
  request.params.logprobs = 0;
  return request;
}

// Consecutive TinyStories text: turn 1's prompt and each next turn's new text.
std::vector<TokenId> text_tokens(const tok::Tokenizer& tokenizer, size_t offset, size_t chars) {
  std::ifstream in(testing::shared_path("golden/stories260K/tinystories_valid.txt"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return tokenizer.encode(buffer.str().substr(offset, chars));
}

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Every policy that parks (page-freeing and read-only ones, compositions), with budgets that drop
// keys from these prompts; indices fit the 2-layer, 2-KV-head models.
const std::vector<std::string> kPolicies = {
    "streaming:S=4,W=48",
    "snapkv:B=48,W=8",
    "pyramidkv:B=48,W=8",
    "adakv:B=40,W=8",
    "keydiff:B=40,W=8",
    "h2o:B=32,W=16",
    "fastgen:T=0.3,W=16,F=0.1",
    "quest:K=4,R=1,S=4,W=16",
    "lserve:K=3,R=3,S=4,W=32,f=0.5",
    "quest:K=4,R=2,S=4,W=16,B=1",
    "layerwise:L=1,rest=snapkv:B=32,W=8",
    "heads:(streaming:S=4,W=32)@kv=0,rest=snapkv:B=40,W=8",
    "layers:(h2o:B=32,W=16)@0,rest=snapkv:B=40,W=8",
};

std::shared_ptr<const sparsity::CalibrationProfile> profile_for(const model::Model& model) {
  auto profile = std::make_shared<sparsity::CalibrationProfile>();
  profile->model_name = "test";
  profile->model_fingerprint = model.fingerprint();
  profile->num_layers = model.config().num_layers;
  profile->num_kv_heads = model.config().num_kv_heads;
  for (int64_t i = 0; i < profile->num_layers * profile->num_kv_heads; ++i)
    profile->streaming_scores.push_back(i % 2 == 0 ? 0.9 : 0.1);
  return profile;
}

class Continuation : public ::testing::TestWithParam<KvDTypeCase> {
 protected:
  void SetUp() override {
    loaded_ = GetParam().load();
    profile_ = profile_for(*loaded_.model);
  }
  EngineConfig config(int32_t num_pages, int32_t chunk) const {
    return {.num_kv_pages = num_pages,
            .page_size = 16,
            .max_batch_tokens = 64,
            .sparse_prefill_chunk = chunk,
            .max_num_seqs = 16,
            .max_queued = 64,
            .kv_dtype = GetParam().dtype,
            .calibration = profile_};
  }
  // Turn 2's tokens as the definition gives them: one sequence in a fresh engine that prefills
  // p1, takes turn 1's output as given, prefills new2 and generates num_tokens more.
  std::vector<TokenId> reference_turn2(const std::vector<TokenId>& p1,
                                       const std::vector<TokenId>& turn1,
                                       const std::vector<TokenId>& new2, const std::string& policy,
                                       int32_t num_tokens) const {
    Engine fresh(config(512, 0), loaded_.model, loaded_.tokenizer);
    Request reference = greedy(p1, policy, static_cast<int32_t>(turn1.size()) + num_tokens);
    reference.given_output = turn1;
    reference.then_prompt = new2;
    const Outcome ref = run_one(fresh, reference);
    return {ref.tokens.begin() + static_cast<std::ptrdiff_t>(turn1.size()), ref.tokens.end()};
  }
  model::LoadedModel loaded_;
  std::shared_ptr<const sparsity::CalibrationProfile> profile_;
};

TEST_P(Continuation, NextTurnsEqualOneSequenceThatTookTheOutputsAsGiven) {
  const tok::Tokenizer& tokenizer = *loaded_.tokenizer;
  const std::vector<TokenId> p1 = text_tokens(tokenizer, 0, 420);
  const std::vector<TokenId> new2 = text_tokens(tokenizer, 2000, 160);
  const std::vector<TokenId> new3 = text_tokens(tokenizer, 4000, 90);
  for (const int32_t chunk : {0, 48}) {
    for (const std::string& policy : kPolicies) {
      SCOPED_TRACE(policy + " chunk " + std::to_string(chunk));
      Engine engine(config(512, chunk), loaded_.model, loaded_.tokenizer);
      const Outcome turn1 = run_one(engine, greedy(p1, policy, 20));
      ASSERT_EQ(turn1.tokens.size(), 20u);
      EXPECT_EQ(engine.stats().kv.num_parked_seqs, 1);
      const std::vector<TokenId> prompt2 = concat(concat(p1, turn1.tokens), new2);
      const Outcome turn2 = run_one(engine, greedy(prompt2, policy, 16));
      ASSERT_FALSE(turn2.error) << *turn2.error;
      // Everything turn 1 computed: its prompt and output but the last token.
      EXPECT_EQ(turn2.usage.cached_prompt_tokens,
                static_cast<int32_t>(p1.size() + turn1.tokens.size()) - 1);
      const std::vector<TokenId> prompt3 = concat(concat(prompt2, turn2.tokens), new3);
      const Outcome turn3 = run_one(engine, greedy(prompt3, policy, 12));
      EXPECT_EQ(turn3.usage.cached_prompt_tokens,
                static_cast<int32_t>(prompt2.size() + turn2.tokens.size()) - 1);
      EXPECT_EQ(engine.stats().num_continued_requests, 2);
      expect_all_pages_free(engine);

      // The reference: one sequence, outputs given, the new text prefilled after them.
      Engine fresh(config(512, chunk), loaded_.model, loaded_.tokenizer);
      Request reference = greedy(p1, policy, 20 + 16);
      reference.given_output = turn1.tokens;
      reference.then_prompt = new2;
      const Outcome ref2 = run_one(fresh, reference);
      ASSERT_EQ(ref2.tokens.size(), 36u);
      EXPECT_EQ(std::vector<TokenId>(ref2.tokens.begin() + 20, ref2.tokens.end()), turn2.tokens);
      EXPECT_EQ(std::vector<float>(ref2.logprobs.begin() + 20, ref2.logprobs.end()),
                turn2.logprobs);
      EXPECT_EQ(fresh.stats().num_continued_requests, 0);
      expect_all_pages_free(fresh);
    }
  }
}

TEST_P(Continuation, APromptThatLeavesTheConversationComputesItAll) {
  // A different turn-1 output (an edited answer) matches nothing parked: the request is computed
  // as it would be in a fresh engine, and the parked state stays for whoever continues it.
  const tok::Tokenizer& tokenizer = *loaded_.tokenizer;
  const std::vector<TokenId> p1 = text_tokens(tokenizer, 0, 420);
  const std::string policy = "snapkv:B=48,W=8";
  Engine engine(config(512, 0), loaded_.model, loaded_.tokenizer);
  Outcome turn1 = run_one(engine, greedy(p1, policy, 20));
  std::vector<TokenId> edited = turn1.tokens;
  edited[5] = edited[5] == 1 ? 2 : 1;
  const std::vector<TokenId> prompt2 = concat(concat(p1, edited), text_tokens(tokenizer, 2000, 80));
  const Outcome turn2 = run_one(engine, greedy(prompt2, policy, 12));
  EXPECT_EQ(engine.stats().num_continued_requests, 0);
  Engine fresh(config(512, 0), loaded_.model, loaded_.tokenizer);
  EXPECT_EQ(run_one(fresh, greedy(prompt2, policy, 12)).tokens, turn2.tokens);
  EXPECT_EQ(engine.stats().kv.num_parked_seqs, 2);  // turn 1's and the edited one's
  expect_all_pages_free(engine);
}

TEST_P(Continuation, ParkedPagesGoBackBeforeAnyoneIsPreempted) {
  const tok::Tokenizer& tokenizer = *loaded_.tokenizer;
  const std::string policy = "streaming:S=4,W=48";
  // A pool that a dense 400-token request fills by more than half.
  Engine engine(config(40, 0), loaded_.model, loaded_.tokenizer);
  for (size_t i = 0; i < 6; ++i)
    run(engine, {greedy(text_tokens(tokenizer, i * 700, 300), policy, 8)});
  const EngineStats parked = engine.stats();
  EXPECT_GE(parked.kv.num_parked_seqs, 2);
  EXPECT_LE(parked.kv.num_parked_pages, 20) << "within half the pool";
  // Text enough to need parked pages (a larger vocabulary takes more characters a token).
  const int32_t free_pages = parked.kv.num_pages - parked.kv.num_parked_pages;
  std::vector<TokenId> long_prompt;
  for (size_t chars = 800; chars <= 3000; chars += 200) {
    long_prompt = text_tokens(tokenizer, 5000, chars);
    if (static_cast<int32_t>((long_prompt.size() + 8 + 15) / 16) > free_pages) break;
  }
  const auto dense_pages = static_cast<int32_t>((long_prompt.size() + 8 + 15) / 16);
  ASSERT_GT(dense_pages, parked.kv.num_pages - parked.kv.num_parked_pages)
      << "the dense request must need parked pages";
  const Outcome dense = run_one(engine, greedy(long_prompt, "full", 8));
  EXPECT_FALSE(dense.error);
  EXPECT_EQ(dense.tokens.size(), 8u);
  const EngineStats after = engine.stats();
  EXPECT_EQ(after.num_preemptions, 0);
  EXPECT_GT(after.kv.num_parked_evictions, 0);
  expect_all_pages_free(engine);
}

TEST_P(Continuation, NoParkingWithAZeroShare) {
  const tok::Tokenizer& tokenizer = *loaded_.tokenizer;
  EngineConfig c = config(512, 0);
  c.max_parked_share = 0;
  Engine engine(c, loaded_.model, loaded_.tokenizer);
  const std::vector<TokenId> p1 = text_tokens(tokenizer, 0, 420);
  const Outcome turn1 = run_one(engine, greedy(p1, "snapkv:B=48,W=8", 10));
  EXPECT_EQ(engine.stats().kv.num_parked_seqs, 0);
  const Outcome turn2 = run_one(engine, greedy(concat(p1, turn1.tokens), "snapkv:B=48,W=8", 10));
  EXPECT_EQ(engine.stats().num_continued_requests, 0);
  EXPECT_EQ(turn2.tokens.size(), 10u);
  expect_all_pages_free(engine);
}

TEST_P(Continuation, AResetOfThePrefixCacheDropsParkedStatesOnlyWhenIdle) {
  // POST /reset_prefix_cache's engine side: refused (nothing changed) while a request is queued
  // or runs; when idle, the parked state is gone and the next turn is computed cold, equal to a
  // fresh engine's.
  const tok::Tokenizer& tokenizer = *loaded_.tokenizer;
  const std::vector<TokenId> p1 = text_tokens(tokenizer, 0, 420);
  const std::string policy = "snapkv:B=48,W=8";
  Engine engine(config(512, 0), loaded_.model, loaded_.tokenizer);
  const Outcome turn1 = run_one(engine, greedy(p1, policy, 12));
  const std::vector<TokenId> prompt2 =
      concat(concat(p1, turn1.tokens), text_tokens(tokenizer, 2000, 80));
  std::vector<bool> answers;
  const auto ask_reset = [&] {
    engine.request_prefix_cache_reset([&](bool reset) { answers.push_back(reset); });
  };

  Outcome running;
  ASSERT_TRUE(std::holds_alternative<RequestId>(engine.submit(
      greedy(text_tokens(tokenizer, 3000, 200), policy, 4), [&](const RequestEvent& event) {
        running.tokens.insert(running.tokens.end(), event.tokens.begin(), event.tokens.end());
      })));
  ask_reset();
  engine.step();
  ASSERT_EQ(answers, std::vector<bool>{false});
  engine.run_until_idle();
  EXPECT_EQ(running.tokens.size(), 4u);
  EXPECT_EQ(engine.stats().kv.num_parked_seqs, 2) << "turn 1's and the other request's";

  ask_reset();
  engine.step();
  ASSERT_EQ(answers, (std::vector<bool>{false, true}));
  EXPECT_EQ(engine.stats().kv.num_parked_seqs, 0);
  expect_all_pages_free(engine);
  const Outcome cold = run_one(engine, greedy(prompt2, policy, 10));
  EXPECT_EQ(cold.usage.cached_prompt_tokens, 0);
  EXPECT_EQ(cold.usage.continued_prompt_tokens, 0);
  Engine fresh(config(512, 0), loaded_.model, loaded_.tokenizer);
  EXPECT_EQ(run_one(fresh, greedy(prompt2, policy, 10)).tokens, cold.tokens);

  // Served again, turn 1 parks again and the next turn continues it, and says so.
  EXPECT_EQ(run_one(engine, greedy(p1, policy, 12)).tokens, turn1.tokens);
  const Outcome continued = run_one(engine, greedy(prompt2, policy, 10));
  EXPECT_EQ(continued.usage.continued_prompt_tokens,
            static_cast<int32_t>(p1.size() + turn1.tokens.size()) - 1);
  EXPECT_EQ(continued.usage.cached_prompt_tokens, continued.usage.continued_prompt_tokens);
  expect_all_pages_free(engine);
}

TEST_P(Continuation, TheParkedStateDoesNotDependOnWhatRanBesideTheFirstTurn) {
  // Turn 1 alone, or batched with other requests of other policies (prefill chunks and decode
  // rows beside its own): the state it parks continues into the same next turn.
  const tok::Tokenizer& tokenizer = *loaded_.tokenizer;
  const std::vector<TokenId> p1 = text_tokens(tokenizer, 0, 60);
  const std::vector<TokenId> new2 = text_tokens(tokenizer, 2000, 60);
  for (const std::string& policy : kPolicies) {
    SCOPED_TRACE(policy);
    std::vector<std::vector<TokenId>> next;
    for (const bool beside : {false, true}) {
      Engine engine(config(512, 48), loaded_.model, loaded_.tokenizer);
      std::vector<Request> requests = {greedy(p1, policy, 50)};
      if (beside) {
        for (size_t i = 0; i < 5; ++i)
          requests.push_back(greedy(text_tokens(tokenizer, 3000 + 400 * i, 100 + 150 * i),
                                    kPolicies[(i * 5) % kPolicies.size()],
                                    10 + 7 * static_cast<int32_t>(i)));
      }
      const auto outcomes = run(engine, requests);
      const std::vector<TokenId>& turn1 = outcomes.at({0, 0}).tokens;
      const Outcome turn2 = run_one(engine, greedy(concat(concat(p1, turn1), new2), policy, 40));
      EXPECT_GT(turn2.usage.continued_prompt_tokens, 0);
      next.push_back(turn2.tokens);
    }
    EXPECT_EQ(next[0], next[1]);
  }
}

TEST_P(Continuation, ParallelSamplesContinueFromOneParkedState) {
  // n = 2 on a continued prompt: both samples start from the adopted state (the second gets a
  // copy at its first token), each equal to the same request in a fresh engine's reference.
  const tok::Tokenizer& tokenizer = *loaded_.tokenizer;
  const std::vector<TokenId> p1 = text_tokens(tokenizer, 0, 420);
  const std::vector<TokenId> new2 = text_tokens(tokenizer, 2000, 120);
  const std::string policy = "h2o:B=32,W=16";
  Engine engine(config(512, 0), loaded_.model, loaded_.tokenizer);
  const Outcome turn1 = run_one(engine, greedy(p1, policy, 12));
  Request turn2 = greedy(concat(concat(p1, turn1.tokens), new2), policy, 10);
  turn2.params.n = 2;
  const auto samples = run(engine, {turn2});
  const std::vector<TokenId> expected = reference_turn2(p1, turn1.tokens, new2, policy, 10);
  EXPECT_EQ(samples.at({0, 0}).tokens, expected);
  EXPECT_EQ(samples.at({0, 1}).tokens, expected);  // greedy: the same
  expect_all_pages_free(engine);
}

TEST_P(Continuation, ASpeculativeRequestContinuesWithoutDraftsOnItsSparseTarget) {
  // A continued turn that asks for prompt lookup or self-speculation: it starts from the parked
  // state and its tokens equal the reference's. Speculation verifies against a dense target
  // only, so a sparse request (and only sparse requests park) runs without drafts.
  const tok::Tokenizer& tokenizer = *loaded_.tokenizer;
  const std::vector<TokenId> p1 = text_tokens(tokenizer, 0, 420);
  const std::vector<TokenId> new2 = text_tokens(tokenizer, 2000, 120);
  const std::string policy = "snapkv:B=48,W=8";
  const std::vector<speculative::SpeculativeConfig> drafts = {
      {.method = speculative::Method::kNgram, .num_speculative_tokens = 4},
      {.method = speculative::Method::kSelfSparse,
       .num_speculative_tokens = 3,
       .kv_policy = sparsity::parse_policy("streaming:S=4,W=16")}};
  for (const speculative::SpeculativeConfig& draft : drafts) {
    Engine engine(config(512, 0), loaded_.model, loaded_.tokenizer);
    const Outcome turn1 = run_one(engine, greedy(p1, policy, 12));
    const std::vector<TokenId> expected = reference_turn2(p1, turn1.tokens, new2, policy, 16);
    Request turn2 = greedy(concat(concat(p1, turn1.tokens), new2), policy, 16);
    turn2.speculative = draft;
    const Outcome out = run_one(engine, turn2);
    ASSERT_FALSE(out.error) << *out.error;
    EXPECT_EQ(out.usage.cached_prompt_tokens,
              static_cast<int32_t>(p1.size() + turn1.tokens.size()) - 1)
        << speculative::method_name(draft.method);
    EXPECT_EQ(out.tokens, expected) << speculative::method_name(draft.method);
    EXPECT_EQ(out.usage.spec_draft_tokens, 0) << speculative::method_name(draft.method);
    expect_all_pages_free(engine);
  }
}

INSTANTIATE_TEST_SUITE_P(KvDTypes, Continuation,
                         ::testing::Values(kStoriesF32, kCopyLmQ8, kCopyLmQ4, kEvalQ8Precise),
                         kv_case_name);

}  // namespace
}  // namespace sieve::engine
