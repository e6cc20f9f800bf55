// "Output is unchanged" for the weight types people download: one request gives the same tokens
// alone (prefill in one pass, then one row per step), in a batch of 32 requests whose steps
// carry 1 to 256 rows, prefilled in chunks of another size, and verified speculatively. The
// quantized matmuls change path with the row count (VNNI tiles from 3 rows, packed panels from
// 40), so this holds only if every path computes each row's dot products in the same order.
// Random-weight models (model_file.h) whose logits are separated far more than rounding error
// would be lenient; these are generated with the llama vocabulary (32000 tokens), where the top
// two logits of 24 steps x 32 requests include near-ties, so a changed rounding shows up.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/generator.h"
#include "engine_test_util.h"
#include "kernels/ops.h"
#include "sparsity/policy_spec.h"
#include "speculative/speculative_config.h"

namespace sieve::engine {
namespace {

// One generated model per weight type: dim 256 (K-quant super-blocks are 256 wide), 2 layers.
model::LoadedModel load_in(kernels::DType dtype) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("sieve_batch_invariance_" + std::to_string(::getpid()) + "_" +
                             std::string(kernels::to_string(dtype)) + ".gguf"))
                               .string();
  ThreadPool pool(2);
  model::write_random_model(
      {.dim = 256,
       .num_layers = 2,
       .num_heads = 4,
       .num_kv_heads = 2,
       .ffn_dim = 512,
       .context_length = 2048,
       .rope_base = 500000.0f,
       .dtype = dtype,
       .vocab_path = testing::shared_path("golden/tokenizer/ggml-vocab-llama-spm.gguf"),
       .seed = 11},
      path, pool);
  model::LoadedModel loaded = model::load_model({path, ""});
  std::filesystem::remove(path);  // mapped: the pages stay until the model goes
  return loaded;
}

class BatchInvariance : public ::testing::TestWithParam<kernels::DType> {};

TEST_P(BatchInvariance, AloneBatchedChunkedAndSpeculativeGiveTheSameTokens) {
  const model::LoadedModel loaded = load_in(GetParam());
  const auto all_prompts = prompts(*loaded.tokenizer, 32);
  std::vector<Request> requests;
  for (const auto& p : all_prompts) requests.push_back(greedy(p, 24));

  // Alone: generate() prefills each prompt in one pass and decodes one row per step.
  std::vector<std::vector<TokenId>> alone(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    generate(*loaded.model, requests[i].prompt,
             {.max_tokens = 24, .sampling = {.temperature = 0.0f}},
             [&](TokenId t, std::span<const float>) {
               alone[i].push_back(t);
               return true;
             });
  }
  // Batched: all at once, steps of up to 256 rows (prefill chunks beside decode rows), then
  // fewer as requests finish; chunked: steps of at most 7 rows, so prompts are cut elsewhere.
  for (int32_t max_batch_tokens : {256, 7}) {
    Engine engine(config(512, max_batch_tokens), loaded.model, loaded.tokenizer);
    const auto got = run(engine, requests);
    for (size_t i = 0; i < requests.size(); ++i)
      EXPECT_EQ(got.at({i, 0}).tokens, alone[i])
          << kernels::to_string(GetParam()) << " prompt " << i << ", steps of " << max_batch_tokens
          << " rows";
    expect_all_pages_free(engine);
  }
  // Speculative: self-speculation (drafts through a sink + window view of the model's own
  // pages, so every step drafts) verified k + 1 rows at a time.
  EngineConfig speculative_config = config(512);
  speculative_config.speculative = {.method = speculative::Method::kSelfSparse,
                                    .num_speculative_tokens = 3,
                                    .kv_policy = sparsity::parse_policy("streaming:S=4,W=16")};
  Engine speculative(speculative_config, loaded.model, loaded.tokenizer);
  const auto got = run(speculative, requests);
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(got.at({i, 0}).tokens, alone[i])
        << kernels::to_string(GetParam()) << " prompt " << i << ", speculative";
  EXPECT_GT(speculative.stats().spec_num_drafts, 0);
  expect_all_pages_free(speculative);
}

INSTANTIATE_TEST_SUITE_P(
    WeightTypes, BatchInvariance,
    ::testing::Values(kernels::DType::kQ4_0, kernels::DType::kQ4_1, kernels::DType::kQ5_0,
                      kernels::DType::kQ5_1, kernels::DType::kIQ4_NL, kernels::DType::kQ8_0,
                      kernels::DType::kQ2_K, kernels::DType::kQ3_K, kernels::DType::kQ4_K,
                      kernels::DType::kQ5_K, kernels::DType::kQ6_K, kernels::DType::kIQ4_XS,
                      kernels::DType::kF16, kernels::DType::kBF16),
    [](const auto& info) { return std::string(kernels::to_string(info.param)); });

}  // namespace
}  // namespace sieve::engine
