// The batched engine against single-sequence runs: continuous batching, preemption, prefix
// caching and parallel sampling must not change what any request generates, and every page
// must be back in the pool afterwards.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "engine/generator.h"
#include "engine_test_util.h"
#include "kernels/backend.h"
#include "kv_dtype_cases.h"
#include "model/loader.h"
#include "model/model_file.h"
#include "shared_data.h"
#include "util/error.h"

namespace sieve::engine {
namespace {

class BatchedEqualsAlone : public ::testing::TestWithParam<bool> {};

TEST_P(BatchedEqualsAlone, ThirtyTwoPromptsTogetherGiveTheTokensEachGivesAlone) {
  model::LoadedModel loaded = GetParam() ? load_generated() : load_stories();
  const auto all_prompts = prompts(*loaded.tokenizer);
  std::vector<Request> requests;
  for (const auto& p : all_prompts) requests.push_back(greedy(p, 24));

  Engine together(config(512), loaded.model, loaded.tokenizer);
  auto batched = run(together, requests);
  expect_all_pages_free(together);
  EXPECT_GT(together.stats().num_steps, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    std::vector<TokenId> alone;
    generate(*loaded.model, requests[i].prompt,
             {.max_tokens = 24, .sampling = {.temperature = 0.0f}},
             [&](TokenId t, std::span<const float>) {
               alone.push_back(t);
               return true;
             });
    const Outcome& o = batched.at({i, 0});
    EXPECT_EQ(o.tokens, alone) << "prompt " << i;
    ASSERT_TRUE(o.finish.has_value());
    EXPECT_EQ(o.finish->reason, FinishReason::kLength);
    EXPECT_EQ(o.usage.completion_tokens, 24);
    EXPECT_EQ(o.usage.prompt_tokens, static_cast<int32_t>(requests[i].prompt.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, BatchedEqualsAlone, ::testing::Values(false, true),
                         [](const auto& info) {
                           return info.param ? "GeneratedGqa" : "Stories260K";
                         });

// Preemption, prefix caching and n > 1 forks (copy-on-write of the shared prompt's last page)
// in each KV dtype: quantized rows move with their scales, so outputs stay those of the same
// dtype without them.
class EngineOnKvDType : public ::testing::TestWithParam<KvDTypeCase> {
 protected:
  EngineConfig config(int32_t num_pages, int32_t max_batch_tokens = 256,
                      bool prefix_caching = true) const {
    return engine::config(num_pages, max_batch_tokens, prefix_caching, GetParam().dtype);
  }
};

TEST_P(EngineOnKvDType, PreemptionUnderASmallPoolKeepsOutputsIdentical) {
  model::LoadedModel loaded = GetParam().load();
  const auto all_prompts = prompts(*loaded.tokenizer, 16);
  std::vector<Request> requests;
  for (const auto& p : all_prompts) requests.push_back(greedy(p, 40));

  Engine roomy(config(512), loaded.model, loaded.tokenizer);
  auto expected = run(roomy, requests);
  EXPECT_EQ(roomy.stats().num_preemptions, 0);

  Engine tight(config(12, 64), loaded.model, loaded.tokenizer);  // 192 tokens of KV for 16 requests
  auto got = run(tight, requests);
  EXPECT_GT(tight.stats().num_preemptions, 0);
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(got.at({i, 0}).tokens, expected.at({i, 0}).tokens) << i;
  expect_all_pages_free(tight);
  expect_all_pages_free(roomy);
}

TEST_P(EngineOnKvDType, RepeatedPromptHitsThePrefixCache) {
  model::LoadedModel loaded = GetParam().load();
  std::vector<TokenId> prompt = loaded.tokenizer->encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun "
      "with her dog. They ran to the park and played with a red ball until the sun went down.");
  ASSERT_GT(prompt.size(), 32u);
  Engine engine(config(128), loaded.model, loaded.tokenizer);
  auto first = run(engine, {greedy(prompt, 16)});
  const EngineStats after_first = engine.stats();
  auto second = run(engine, {greedy(prompt, 16)});
  const EngineStats after_second = engine.stats();
  EXPECT_EQ(second.at({0, 0}).tokens, first.at({0, 0}).tokens);
  const int64_t cached = (static_cast<int64_t>(prompt.size()) - 1) / 16 * 16;
  EXPECT_EQ(after_second.kv.num_prefix_hit_tokens - after_first.kv.num_prefix_hit_tokens, cached);
  EXPECT_EQ(second.at({0, 0}).usage.cached_prompt_tokens, cached);
  EXPECT_EQ(after_second.num_prompt_tokens_computed - after_first.num_prompt_tokens_computed,
            static_cast<int64_t>(prompt.size()) - cached);
  expect_all_pages_free(engine);
}

TEST_P(EngineOnKvDType, ParallelSamplesShareThePromptAndEachEqualsItsSeedAlone) {
  model::LoadedModel loaded = GetParam().load();
  std::vector<TokenId> prompt =
      loaded.tokenizer->encode("Once upon a time, there was a big dog who");
  Request request{.prompt = prompt};
  request.params.temperature = 0.9f;
  request.params.top_k = 40;
  request.params.seed = 1234;
  request.params.max_tokens = 32;
  request.params.ignore_eos = true;
  request.params.n = 4;

  Engine engine(config(128, 256, /*prefix_caching=*/false), loaded.model, loaded.tokenizer);
  auto together = run(engine, {request});
  expect_all_pages_free(engine);
  ASSERT_EQ(together.size(), 4u);
  // The prompt was computed once for all four samples.
  EXPECT_EQ(engine.stats().num_prompt_tokens_computed, static_cast<int64_t>(prompt.size()));

  std::set<std::vector<TokenId>> distinct;
  for (int i = 0; i < 4; ++i) {
    Engine alone_engine(config(128, 256, false), loaded.model, loaded.tokenizer);
    auto alone = run(alone_engine,
                     {Request{.prompt = prompt, .params = params_for_sample(request.params, i)}});
    EXPECT_EQ(together.at({0, i}).tokens, alone.at({0, 0}).tokens) << "sample " << i;
    distinct.insert(together.at({0, i}).tokens);
  }
  EXPECT_GT(distinct.size(), 1u) << "samples with different seeds should differ";
}

// The evaluation model's wired induction head (layer 1, kv head 0) is the one precise stream of
// its q8 and q4 caches: each page carries that head's f16 K and V too, and --kv-memory pays for
// them; --no-precise-kv-heads drops them.
TEST(EngineKvMemory, PagesOfQuantizedCachesPayForTheirPreciseHeads) {
  model::LoadedModel loaded =
      model::load_model({std::string(SIEVE_SOURCE_DIR) + "/models/eval-32k.gguf", ""});
  const model::ModelConfig& mc = loaded.model->config();
  for (kernels::DType dtype : {kernels::DType::kQ8_0, kernels::DType::kQ4_1}) {
    SCOPED_TRACE(std::string(model::kv_dtype_name(dtype)));
    EngineConfig with = engine::config(64, 256, true, dtype);
    with.num_kv_pages = 0;
    with.kv_memory_bytes = uint64_t{8} << 20;
    EngineConfig without = with;
    without.precise_kv_heads = false;
    Engine precise(with, loaded.model, loaded.tokenizer);
    Engine plain(without, loaded.model, loaded.tokenizer);
    EXPECT_EQ(precise.kv_bytes_per_page(),
              static_cast<int64_t>(model::KvCache::bytes_per_page(mc, 16, dtype, 1)));
    EXPECT_EQ(plain.kv_bytes_per_page(),
              static_cast<int64_t>(model::KvCache::bytes_per_page(mc, 16, dtype)));
    EXPECT_EQ(precise.config().num_kv_pages, (8 << 20) / precise.kv_bytes_per_page());
    EXPECT_EQ(plain.config().num_kv_pages, (8 << 20) / plain.kv_bytes_per_page());
    // A quarter of a spare f16 area per page, for compressed sequences' copies.
    EXPECT_EQ(precise.stats().kv.num_spare_areas, precise.config().num_kv_pages / 4);
    EXPECT_EQ(plain.stats().kv.num_spare_areas, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(KvDTypes, EngineOnKvDType,
                         ::testing::Values(kStoriesF32, kCopyLmQ8, kCopyLmQ4, kEvalQ8Precise),
                         kv_case_name);

// --kv-memory buys pages of the dtype's real size: q4 pages are 1.25 bytes per value against
// f16's 2 per value, so the same bytes hold 3.2x the pages (the ratio computed, not assumed);
// a request's usage counts the bytes of its pages.
TEST(Engine, KvMemoryIsCountedInBytesOfTheKvDType) {
  model::LoadedModel loaded = kCopyLmQ4.load();
  const model::ModelConfig& mc = loaded.model->config();
  const uint64_t kv_memory = 3ull << 20;
  std::map<kernels::DType, int32_t> pages;
  for (kernels::DType dtype :
       {kernels::DType::kF32, kernels::DType::kF16, kernels::DType::kQ8_0, kernels::DType::kQ4_1}) {
    EngineConfig c = config(0, 256, true, dtype);
    c.kv_memory_bytes = kv_memory;
    Engine engine(c, loaded.model, loaded.tokenizer);
    const auto page_bytes = static_cast<uint64_t>(engine.kv_bytes_per_page());
    EXPECT_EQ(page_bytes, model::KvCache::bytes_per_page(mc, 16, dtype));
    pages[dtype] = engine.config().num_kv_pages;
    EXPECT_EQ(pages[dtype], static_cast<int32_t>(kv_memory / page_bytes));
    EXPECT_EQ(engine.stats().kv_bytes_total(), int64_t{pages[dtype]} * engine.kv_bytes_per_page());
    EXPECT_LE(static_cast<uint64_t>(engine.stats().kv_bytes_total()), kv_memory);

    const auto outcome = run(engine, {greedy(prompts(*loaded.tokenizer, 1)[0], 20)}).at({0, 0});
    ASSERT_GT(outcome.usage.kv_pages, 0);
    EXPECT_EQ(outcome.usage.kv_bytes, outcome.usage.kv_pages * engine.kv_bytes_per_page());
    EXPECT_EQ(outcome.usage.kv_dense_bytes,
              outcome.usage.kv_dense_pages * engine.kv_bytes_per_page());
  }
  const double f16_over_q4 =
      static_cast<double>(model::KvCache::bytes_per_page(mc, 16, kernels::DType::kF16)) /
      static_cast<double>(model::KvCache::bytes_per_page(mc, 16, kernels::DType::kQ4_1));
  EXPECT_NEAR(static_cast<double>(pages[kernels::DType::kQ4_1]) / pages[kernels::DType::kF16],
              f16_over_q4, 0.01 * f16_over_q4);
  EXPECT_GT(pages[kernels::DType::kQ4_1], 3 * pages[kernels::DType::kF16]);
  EXPECT_GT(pages[kernels::DType::kQ8_0], pages[kernels::DType::kF16]);
  EXPECT_EQ(pages[kernels::DType::kF16], 2 * pages[kernels::DType::kF32]);
}

// Without --kv-memory the pool holds max_num_seqs whole contexts of the model in its KV dtype:
// stories260K's is 64 x 32 pages of 20 KiB (40 MiB), not a fixed 512 MiB; a model whose
// contexts take more gets the cap; an explicit size wins.
TEST(Engine, DefaultKvPoolIsSizedFromTheModel) {
  model::LoadedModel loaded = load_stories();
  const model::ModelConfig& mc = loaded.model->config();
  ASSERT_EQ(mc.context_length, 512);
  EngineConfig c = config(0);
  const uint64_t page_bytes = model::KvCache::bytes_per_page(mc, 16, c.kv_dtype);
  ASSERT_EQ(page_bytes,
            2u * 16 * 4 * 8 * 5 * sizeof(float));  // K and V x tokens x heads x dim x layers
  EXPECT_EQ(default_kv_memory_bytes(mc, c), 64 * 32 * page_bytes);
  {
    Engine engine(c, loaded.model, loaded.tokenizer);
    EXPECT_EQ(engine.config().num_kv_pages, 64 * 32);
  }
  c.max_num_seqs = 4;
  EXPECT_EQ(default_kv_memory_bytes(mc, c), 4 * 32 * page_bytes);
  c.kv_dtype = kernels::DType::kF16;
  EXPECT_EQ(default_kv_memory_bytes(mc, c), 4 * 32 * page_bytes / 2);

  model::ModelConfig large = mc;  // Llama 2 7B's shape: 512 KiB of f32 K/V per token
  large.num_layers = 32;
  large.num_heads = 32;
  large.num_kv_heads = 32;
  large.head_dim = 128;
  large.context_length = 4096;
  EXPECT_EQ(default_kv_memory_bytes(large, config(0)), kDefaultKvMemoryCapBytes);

  EngineConfig given = config(0);
  given.kv_memory_bytes = 1ull << 20;
  Engine engine(given, loaded.model, loaded.tokenizer);
  EXPECT_EQ(engine.config().num_kv_pages, static_cast<int32_t>((1ull << 20) / page_bytes));
}

// q8 / q4 store K/V rows in blocks of 32: a model with head_dim 8 is refused when the engine is
// made, naming the dtype and the head_dim, not at its first request.
TEST(Engine, QuantizedKvRefusesAHeadDimItCannotStore) {
  model::LoadedModel loaded = load_stories();
  for (kernels::DType dtype : {kernels::DType::kQ8_0, kernels::DType::kQ4_1}) {
    for (const int32_t num_pages : {0, 64}) {  // sized by --kv-memory, or given
      try {
        Engine engine(config(num_pages, 256, true, dtype), loaded.model, loaded.tokenizer);
        ADD_FAILURE() << "stories260K accepted for " << model::kv_dtype_name(dtype);
      } catch (const Error& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find(std::string(model::kv_dtype_name(dtype))), std::string::npos)
            << message;
        EXPECT_NE(message.find("head_dim is 8"), std::string::npos) << message;
      }
    }
  }
}

TEST(Engine, CancelFreesPagesAndRejectionsAreClear) {
  model::LoadedModel loaded = load_stories();
  Engine engine(config(8), loaded.model, loaded.tokenizer);  // 128 tokens of KV
  auto too_big =
      engine.submit(greedy(std::vector<TokenId>(100, 5), 100), [](const RequestEvent&) {});
  ASSERT_TRUE(std::holds_alternative<AdmissionError>(too_big));
  EXPECT_EQ(std::get<AdmissionError>(too_big).kind, AdmissionError::Kind::kNeverFits);
  auto too_long =
      engine.submit(greedy(std::vector<TokenId>(600, 5), 1), [](const RequestEvent&) {});
  ASSERT_TRUE(std::holds_alternative<AdmissionError>(too_long));
  EXPECT_EQ(std::get<AdmissionError>(too_long).kind, AdmissionError::Kind::kTooLong);
  EXPECT_EQ(std::get<AdmissionError>(too_long).param, "prompt");
  EXPECT_NE(std::get<AdmissionError>(too_long).message.find("600"), std::string::npos);
  Request hot = greedy({1, 2, 3}, 4);
  hot.params.temperature = -1.0f;
  auto invalid = engine.submit(hot, [](const RequestEvent&) {});
  ASSERT_TRUE(std::holds_alternative<AdmissionError>(invalid));
  EXPECT_EQ(std::get<AdmissionError>(invalid).kind, AdmissionError::Kind::kInvalidParams);
  EXPECT_EQ(std::get<AdmissionError>(invalid).param, "temperature");

  std::optional<std::string> error;
  int tokens = 0;
  auto id = engine.submit(greedy(loaded.tokenizer->encode("Once upon a time"), 100),
                          [&](const RequestEvent& e) {
                            tokens += static_cast<int>(e.tokens.size());
                            if (e.error) error = e.error;
                          });
  ASSERT_TRUE(std::holds_alternative<RequestId>(id));
  engine.step();
  engine.step();
  engine.cancel(std::get<RequestId>(id));
  engine.run_until_idle();
  EXPECT_EQ(error, "cancelled");
  EXPECT_EQ(tokens, 2);
  expect_all_pages_free(engine);
}

TEST(Engine, SubmitRefusesBeyondTheQueueLimit) {
  model::LoadedModel loaded = load_stories();
  EngineConfig queue_of_two = config(64);
  queue_of_two.max_queued = 2;
  Engine engine(queue_of_two, loaded.model, loaded.tokenizer);
  const auto submit = [&] {
    return engine.submit(greedy({1, 2, 3}, 2), [](const RequestEvent&) {});
  };
  EXPECT_TRUE(std::holds_alternative<RequestId>(submit()));
  EXPECT_TRUE(std::holds_alternative<RequestId>(submit()));
  auto refused = submit();
  ASSERT_TRUE(std::holds_alternative<AdmissionError>(refused));
  EXPECT_EQ(std::get<AdmissionError>(refused).kind, AdmissionError::Kind::kQueueFull);
  EXPECT_EQ(std::get<AdmissionError>(refused).param, std::nullopt);
  engine.run_until_idle();
  EXPECT_TRUE(std::holds_alternative<RequestId>(submit()));  // room again once drained
  engine.run_until_idle();
  expect_all_pages_free(engine);
}

TEST(Engine, BackgroundLoopServesConcurrentSubmitters) {
  model::LoadedModel loaded = load_stories();
  Engine engine(config(256), loaded.model, loaded.tokenizer);
  engine.start();
  std::mutex mutex;
  std::condition_variable done;
  int finished = 0;
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      auto id = engine.submit(greedy(loaded.tokenizer->encode("Lily and Ben"), 8 + c),
                              [&](const RequestEvent& e) {
                                if (!e.finish) return;
                                std::lock_guard lock(mutex);
                                ++finished;
                                done.notify_all();
                              });
      EXPECT_TRUE(std::holds_alternative<RequestId>(id));
    });
  }
  for (auto& t : clients) t.join();
  std::unique_lock lock(mutex);
  EXPECT_TRUE(done.wait_for(lock, std::chrono::seconds(30), [&] { return finished == 4; }));
  lock.unlock();
  engine.stop();
  expect_all_pages_free(engine);
}

}  // namespace
}  // namespace sieve::engine
