// draft_model speculation: a second model with the target's vocabulary drafts from its own paged
// KV. Drafts are verified exactly, so every request generates what plain decoding generates
// (greedy, and sampled for the same seed), whatever the draft's quality, batch, preemption or
// cancellation, and both the target's and the draft's pages go back to their pools.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "model/model_file.h"
#include "speculative/speculative_config.h"
#include "speculative_test_util.h"
#include "util/error.h"

namespace sieve::engine {
namespace {

const std::string& stories_path() {
  static const std::string path = testing::shared_path("models/stories260K.gguf");
  return path;
}

// A tiny random-weight model (1 layer, dim 32) with the vocabulary of `vocab_gguf`.
std::string random_draft(const std::string& vocab_gguf, const std::string& tag) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("sieve_draft_" + tag + "_" + std::to_string(::getpid()) + ".gguf"))
                               .string();
  if (!std::filesystem::exists(path)) {
    ThreadPool pool(2);
    model::write_random_model({.dim = 32,
                               .num_layers = 1,
                               .num_heads = 2,
                               .num_kv_heads = 1,
                               .ffn_dim = 64,
                               .context_length = 1024,
                               .rope_base = 10000.0f,
                               .dtype = kernels::DType::kF32,
                               .vocab_path = vocab_gguf,
                               .seed = 11},
                              path, pool);
  }
  return path;
}

const std::string& random_stories_draft() {
  static const std::string path = random_draft(stories_path(), "stories");
  return path;
}

speculative::SpeculativeConfig draft_model(int32_t k, const std::string& path) {
  return {.method = speculative::Method::kDraftModel, .num_speculative_tokens = k, .model = path};
}

EngineConfig with_speculation(EngineConfig c, const speculative::SpeculativeConfig& speculative) {
  c.speculative = speculative;
  return c;
}

// Both pools back to their start.
void expect_all_pages_free_with_draft(const Engine& engine) {
  expect_all_pages_free(engine);
  const EngineStats stats = engine.stats();
  EXPECT_GT(stats.draft_kv.num_pages, 0) << "no draft pool";
  EXPECT_EQ(stats.draft_kv.num_free_pages, stats.draft_kv.num_pages) << "draft KV pages leaked";
}

// Usage sums to the engine's counters.
void expect_usage_matches_counters(const std::map<std::pair<size_t, int>, Outcome>& got,
                                   const EngineStats& stats) {
  int64_t drafted = 0, accepted = 0;
  for (const auto& [key, outcome] : got) {
    drafted += outcome.usage.spec_draft_tokens;
    accepted += outcome.usage.spec_accepted_tokens;
  }
  EXPECT_EQ(drafted, stats.spec_num_draft_tokens);
  EXPECT_EQ(accepted, stats.spec_num_accepted_tokens);
}

// The target as its own draft: under greedy every draft is the target's own argmax, so every
// draft token is accepted, and the output is plain decoding's.
TEST(DraftModel, TheTargetAsItsOwnDraftIsAcceptedEveryTime) {
  model::LoadedModel loaded = load_stories();
  auto all_prompts = prompts(*loaded.tokenizer, 12);
  for (auto& p : repetitive_prompts(*loaded.tokenizer)) all_prompts.push_back(p);
  const std::vector<Request> requests = greedy_requests(all_prompts, 40);
  Engine plain(config(512), loaded.model, loaded.tokenizer);
  const auto expected = run(plain, requests);
  Engine speculative(with_speculation(config(512), draft_model(4, stories_path())), loaded.model,
                     loaded.tokenizer);
  const auto got = run(speculative, requests);
  expect_same_tokens(got, expected);
  const EngineStats stats = speculative.stats();
  EXPECT_GT(stats.spec_num_draft_tokens, 0);
  EXPECT_EQ(stats.spec_num_accepted_tokens, stats.spec_num_draft_tokens);
  expect_usage_matches_counters(got, stats);
  // Alone or not, each accepted draft saves a step of its sequence: far fewer steps.
  EXPECT_LT(stats.num_steps, plain.stats().num_steps / 3);
  EXPECT_GT(got.at({0, 0}).usage.spec_draft_kv_pages, 0);
  expect_all_pages_free_with_draft(speculative);
}

// A random-weight draft of the same vocabulary: mostly rejected, some accepted; the output is
// plain decoding's token for token.
TEST(DraftModel, ARandomDraftGivesThePlainTokens) {
  model::LoadedModel loaded = load_stories();
  auto all_prompts = prompts(*loaded.tokenizer, 12);
  for (auto& p : repetitive_prompts(*loaded.tokenizer)) all_prompts.push_back(p);
  const std::vector<Request> requests = greedy_requests(all_prompts, 40);
  Engine plain(config(512), loaded.model, loaded.tokenizer);
  const auto expected = run(plain, requests);
  Engine speculative(with_speculation(config(512), draft_model(3, random_stories_draft())),
                     loaded.model, loaded.tokenizer);
  const auto got = run(speculative, requests);
  expect_same_tokens(got, expected);
  const EngineStats stats = speculative.stats();
  EXPECT_GT(stats.spec_num_draft_tokens, 0);
  EXPECT_LT(stats.spec_num_accepted_tokens, stats.spec_num_draft_tokens) << "none rejected";
  expect_usage_matches_counters(got, stats);
  expect_all_pages_free_with_draft(speculative);
}

// copy-lm drafted by copy-only (an earlier checkpoint of the same run, the same stories260K
// vocabulary): the copying drafts are often right.
TEST(DraftModel, CopyLmDraftedByCopyOnly) {
  model::LoadedModel loaded =
      model::load_model({testing::shared_path("models/copy/copy-lm.gguf"), ""});
  const std::vector<Request> requests = greedy_requests(repetitive_prompts(*loaded.tokenizer), 48);
  Engine plain(config(256), loaded.model, loaded.tokenizer);
  const auto expected = run(plain, requests);
  Engine speculative(
      with_speculation(config(256),
                       draft_model(4, testing::shared_path("models/copy/copy-only.gguf"))),
      loaded.model, loaded.tokenizer);
  const auto got = run(speculative, requests);
  expect_same_tokens(got, expected);
  EXPECT_GT(speculative.stats().spec_num_accepted_tokens, 0);
  expect_all_pages_free_with_draft(speculative);
}

// Sampling (temperature 1, top-p 0.9 and others): each row draws from the sequence's own RNG as
// plain decoding does, so the same seed gives the same tokens.
TEST(DraftModel, SampledOutputEqualsPlainDecodingForTheSameSeed) {
  model::LoadedModel loaded = load_stories();
  const auto all_prompts = repetitive_prompts(*loaded.tokenizer);
  std::vector<Request> requests;
  for (size_t i = 0; i < all_prompts.size() * 2; ++i) {
    Request r{.prompt = all_prompts[i % all_prompts.size()]};
    r.params.temperature = i % 2 == 0 ? 1.0f : 0.7f;
    r.params.top_p = 0.9f;
    r.params.repetition_penalty = i % 2 == 0 ? 1.1f : 1.0f;
    r.params.seed = 100 + i;
    r.params.max_tokens = 40;
    r.params.ignore_eos = true;
    r.params.logprobs = 2;
    requests.push_back(r);
  }
  Engine plain(config(512), loaded.model, loaded.tokenizer);
  const auto expected = run(plain, requests);
  Engine speculative(with_speculation(config(512), draft_model(3, stories_path())), loaded.model,
                     loaded.tokenizer);
  const auto got = run(speculative, requests);
  expect_same_tokens(got, expected);
  EXPECT_GT(speculative.stats().spec_num_accepted_tokens, 0);
  EXPECT_LT(speculative.stats().spec_num_accepted_tokens,
            speculative.stats().spec_num_draft_tokens);
  expect_all_pages_free_with_draft(speculative);
}

// One batch of everything on a draft_model engine: k = 2 and 6, ngram, no speculation, a sparse
// KV policy (decodes without drafts), stop strings, n = 3; each equals plain decoding.
TEST(DraftModel, MixedBatchEqualsPlainDecoding) {
  model::LoadedModel loaded = load_stories();
  const auto all_prompts = repetitive_prompts(*loaded.tokenizer);
  std::vector<Request> requests;
  for (size_t i = 0; i < 14; ++i) {
    Request r = greedy(all_prompts[i % all_prompts.size()], 30 + static_cast<int32_t>(i));
    switch (i % 7) {
      case 0:
        r.speculative = draft_model(2, stories_path());
        break;
      case 1:
        r.speculative = draft_model(6, stories_path());
        break;
      case 2:
        r.speculative = ngram(4);
        break;
      case 3:
        r.speculative = speculative::SpeculativeConfig{};
        break;
      case 4:
        r.kv_policy = sparsity::parse_policy("streaming:S=4,W=32");
        break;
      case 5:
        r.params.stop_strings = {"park.", "four"};
        break;
      case 6:
        r.params.n = 3;
        r.params.temperature = 0.8f;
        r.params.seed = 7;
        break;
    }
    requests.push_back(r);
  }
  Engine together(with_speculation(config(512), draft_model(4, random_stories_draft())),
                  loaded.model, loaded.tokenizer);
  // Requests name the loaded draft model: the random one, not stories260K.
  for (Request& r : requests) {
    if (r.speculative && r.speculative->method == speculative::Method::kDraftModel)
      r.speculative->model = random_stories_draft();
  }
  const auto got = run(together, requests);
  std::vector<Request> plain_requests = requests;
  for (Request& r : plain_requests) r.speculative = speculative::SpeculativeConfig{};
  Engine plain(config(512), loaded.model, loaded.tokenizer);
  const auto expected = run(plain, plain_requests);
  expect_same_tokens(got, expected);
  EXPECT_GT(together.stats().spec_num_draft_tokens, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i % 7 == 3 || i % 7 == 4) {
      EXPECT_EQ(got.at({i, 0}).usage.spec_draft_tokens, 0) << i;
    }
    if (i % 7 == 6) {
      for (int s = 0; s < 3; ++s) EXPECT_GT(got.at({i, s}).usage.spec_draft_tokens, 0) << i;
    }
  }
  expect_all_pages_free_with_draft(together);
}

// A pool too small for the batch: sequences are preempted mid-speculation (their drafts dropped,
// their target and draft pages freed) and recomputed; outputs are unchanged, no page leaks.
TEST(DraftModel, PreemptionMidSpeculationKeepsOutputsAndPages) {
  model::LoadedModel loaded = load_stories();
  auto all_prompts = prompts(*loaded.tokenizer, 12);
  for (auto& p : repetitive_prompts(*loaded.tokenizer)) all_prompts.push_back(p);
  const std::vector<Request> requests = greedy_requests(all_prompts, 48);
  Engine roomy(config(512), loaded.model, loaded.tokenizer);
  const auto expected = run(roomy, requests);
  Engine tight(with_speculation(config(14, 64), draft_model(6, stories_path())), loaded.model,
               loaded.tokenizer);
  const auto got = run(tight, requests);
  EXPECT_GT(tight.stats().num_preemptions, 0);
  EXPECT_GT(tight.stats().spec_num_drafts, 0);
  expect_same_tokens(got, expected);
  expect_all_pages_free_with_draft(tight);
}

// Cancelling requests while they speculate frees every page of both pools.
TEST(DraftModel, CancellationMidSpeculationFreesEverything) {
  model::LoadedModel loaded = load_stories();
  Engine engine(with_speculation(config(256), draft_model(5, random_stories_draft())), loaded.model,
                loaded.tokenizer);
  std::vector<RequestId> ids;
  for (const auto& p : repetitive_prompts(*loaded.tokenizer)) {
    auto id = engine.submit(greedy(p, 200), [](const RequestEvent&) {});
    ASSERT_TRUE(std::holds_alternative<RequestId>(id));
    ids.push_back(std::get<RequestId>(id));
  }
  while (engine.stats().spec_num_drafts < 8) ASSERT_TRUE(engine.step());
  EXPECT_LT(engine.stats().draft_kv.num_free_pages, engine.stats().draft_kv.num_pages);
  for (RequestId id : ids) engine.cancel(id);
  engine.run_until_idle();
  expect_all_pages_free_with_draft(engine);
}

// The draft's pool has the target's page count, and both come out of one KV budget.
TEST(DraftModel, BothPoolsComeOutOfOneBudget) {
  model::LoadedModel loaded = load_stories();
  EngineConfig c = config(0);
  c.kv_memory_bytes = 4u << 20;
  const Engine plain(c, loaded.model, loaded.tokenizer);
  const Engine speculative(with_speculation(c, draft_model(4, random_stories_draft())),
                           loaded.model, loaded.tokenizer);
  const EngineStats stats = speculative.stats();
  EXPECT_EQ(stats.draft_kv.num_pages, stats.kv.num_pages);
  EXPECT_LT(stats.kv.num_pages, plain.stats().kv.num_pages);
  EXPECT_LE(stats.kv_bytes_total(), int64_t{4} << 20);
  EXPECT_GT(stats.kv_bytes_total(),
            (int64_t{4} << 20) - stats.kv_bytes_per_page - stats.draft_kv_bytes_per_page);
}

// What is refused, and how: a draft with another vocabulary (at engine start, naming both files),
// a request naming another draft file than the one loaded, draft_model on an engine that loaded
// none.
TEST(DraftModel, RefusalsNameTheProblem) {
  model::LoadedModel loaded = load_stories();
  const std::string other_vocab =
      random_draft(testing::shared_path("golden/tokenizer/ggml-vocab-llama-spm.gguf"), "spm");
  EngineConfig mismatched = with_speculation(config(64), draft_model(4, other_vocab));
  mismatched.model_path = stories_path();
  try {
    Engine engine(mismatched, loaded.model, loaded.tokenizer);
    FAIL() << "a draft with another vocabulary was accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(other_vocab), std::string::npos) << message;
    EXPECT_NE(message.find(stories_path()), std::string::npos) << message;
    EXPECT_NE(message.find("vocabulary"), std::string::npos) << message;
  }

  Engine engine(with_speculation(config(64), draft_model(4, random_stories_draft())), loaded.model,
                loaded.tokenizer);
  Request r = greedy(repetitive_prompts(*loaded.tokenizer)[0], 4);
  r.speculative = draft_model(2, stories_path());
  auto refused = engine.submit(r, [](const RequestEvent&) {});
  ASSERT_TRUE(std::holds_alternative<AdmissionError>(refused));
  EXPECT_EQ(std::get<AdmissionError>(refused).param, "speculative");
  EXPECT_NE(std::get<AdmissionError>(refused).message.find("one draft model"), std::string::npos)
      << std::get<AdmissionError>(refused).message;
  r.speculative = draft_model(2, random_stories_draft());
  EXPECT_TRUE(std::holds_alternative<RequestId>(engine.submit(r, [](const RequestEvent&) {})));
  engine.run_until_idle();

  Engine without(config(64), loaded.model, loaded.tokenizer);
  auto no_draft = without.submit(r, [](const RequestEvent&) {});
  ASSERT_TRUE(std::holds_alternative<AdmissionError>(no_draft));
  EXPECT_NE(std::get<AdmissionError>(no_draft).message.find("no draft model"), std::string::npos)
      << std::get<AdmissionError>(no_draft).message;
}

}  // namespace
}  // namespace sieve::engine
