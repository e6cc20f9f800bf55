// Properties of the forward pass that the golden tests do not pin down: batching across
// sequences, prefill vs token-by-token, and the two RoPE orderings.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "model/llama.h"
#include "model/loader.h"
#include "shared_data.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace sieve {
namespace {

model::LoadedModel load() { return model::load_model({testing::shared_path("models/stories260K.gguf"), ""}); }

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float diff = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) diff = std::max(diff, std::fabs(a[i] - b[i]));
  return diff;
}

// Logits of every position of `tokens`, fed one token per forward call.
std::vector<float> token_by_token(const model::LlamaModel& m, const std::vector<int32_t>& tokens, ThreadPool& pool) {
  auto [cache, table] = model::KvCache::for_one_sequence(m.config(), static_cast<int32_t>(tokens.size()));
  model::ForwardScratch scratch;
  std::vector<float> all, logits;
  for (size_t i = 0; i < tokens.size(); ++i) {
    model::Batch batch;
    batch.begin_sequence(table);
    batch.add(tokens[i], static_cast<int32_t>(i), true);
    m.forward(batch, cache, pool, scratch, logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

TEST(Forward, PrefillBatchEqualsTokenByToken) {
  model::LoadedModel loaded = load();
  ThreadPool pool(3);
  std::vector<int32_t> tokens = loaded.tokenizer->encode("Once upon a time there was a little girl named Lily.");
  auto [cache, table] =
      model::KvCache::for_one_sequence(loaded.model->config(), static_cast<int32_t>(tokens.size()), 4);
  model::ForwardScratch scratch;
  model::Batch batch;
  batch.begin_sequence(table);
  for (size_t i = 0; i < tokens.size(); ++i) batch.add(tokens[i], static_cast<int32_t>(i), true);
  std::vector<float> batched;
  loaded.model->forward(batch, cache, pool, scratch, batched);
  EXPECT_LT(max_abs_diff(batched, token_by_token(*loaded.model, tokens, pool)), 1e-4f);
}

TEST(Forward, RaggedBatchOfSequencesEqualsEachAlone) {
  model::LoadedModel loaded = load();
  ThreadPool pool(2);
  const std::vector<std::string> prompts = {"Once upon a time", "The dog ran to the big red ball and",
                                            "Sara"};
  // Pages of 4 tokens, handed out interleaved and out of order between the sequences.
  model::KvCache cache(loaded.model->config(), 16, 4);
  const std::vector<std::vector<int32_t>> tables = {{9, 2, 14}, {5, 11, 0, 7, 3}, {12}};
  model::ForwardScratch scratch;
  model::Batch batch;
  std::vector<std::vector<int32_t>> encoded;
  for (size_t s = 0; s < prompts.size(); ++s) {
    encoded.push_back(loaded.tokenizer->encode(prompts[s]));
    ASSERT_LE(encoded[s].size(), tables[s].size() * 4);
    batch.begin_sequence(tables[s]);
    for (size_t i = 0; i < encoded[s].size(); ++i) batch.add(encoded[s][i], static_cast<int32_t>(i), true);
  }
  std::vector<float> batched;
  loaded.model->forward(batch, cache, pool, scratch, batched);
  const int64_t vocab = loaded.model->config().vocab_size;
  size_t row = 0;
  for (size_t s = 0; s < prompts.size(); ++s) {
    std::vector<float> alone = token_by_token(*loaded.model, encoded[s], pool);
    std::vector<float> mine(batched.begin() + row * vocab, batched.begin() + (row + encoded[s].size()) * vocab);
    EXPECT_LT(max_abs_diff(mine, alone), 1e-4f) << prompts[s];
    row += encoded[s].size();
  }
}

TEST(Forward, RejectsPositionsOutsideTheBlockTableBadPagesAndBadTokens) {
  model::LoadedModel loaded = load();
  ThreadPool pool(1);
  model::KvCache cache(loaded.model->config(), 2, 4);
  model::ForwardScratch scratch;
  std::vector<float> logits;
  model::Batch batch;
  batch.begin_sequence({0});
  batch.add(1, 4, true);  // the block table covers positions 0..3
  EXPECT_THROW(loaded.model->forward(batch, cache, pool, scratch, logits), Error);
  batch.clear();
  batch.begin_sequence({0});
  batch.add(512, 0, true);  // vocabulary has 512 tokens
  EXPECT_THROW(loaded.model->forward(batch, cache, pool, scratch, logits), Error);
  batch.clear();
  batch.begin_sequence({2});  // page 2 does not exist
  batch.add(1, 0, true);
  EXPECT_THROW(loaded.model->forward(batch, cache, pool, scratch, logits), Error);
}

// The same model with Q/K rows permuted from adjacent-pair to half-split order and NeoX RoPE
// computes exactly the same function.
TEST(Forward, NeoxOrderingOnPermutedWeightsMatchesNormal) {
  model::LoadedModel loaded = load();
  const model::LlamaModel& original = *loaded.model;
  model::ModelConfig config = original.config();
  model::Weights weights = original.weights();
  config.rope.ordering = model::RopeOrdering::kNeox;
  auto buffers = std::make_shared<std::vector<std::vector<float>>>();
  auto permute = [&](const kernels::MatrixView& m, int64_t num_heads) {
    EXPECT_EQ(m.dtype, kernels::DType::kF32);
    const float* src = static_cast<const float*>(m.data);
    std::vector<float> out(m.rows * m.cols);
    const int64_t hd = config.head_dim, half = hd / 2;
    for (int64_t h = 0; h < num_heads; ++h) {
      for (int64_t i = 0; i < half; ++i) {
        std::copy_n(src + (h * hd + 2 * i) * m.cols, m.cols, out.data() + (h * hd + i) * m.cols);
        std::copy_n(src + (h * hd + 2 * i + 1) * m.cols, m.cols, out.data() + (h * hd + i + half) * m.cols);
      }
    }
    buffers->push_back(std::move(out));
    return kernels::MatrixView{m.dtype, buffers->back().data(), m.rows, m.cols};
  };
  buffers->reserve(2 * weights.layers.size());
  for (model::LayerWeights& layer : weights.layers) {
    layer.wq = permute(layer.wq, config.num_heads);
    layer.wk = permute(layer.wk, config.num_kv_heads);
  }
  weights.storage = std::make_shared<std::pair<std::shared_ptr<const void>, decltype(buffers)>>(weights.storage, buffers);
  model::LlamaModel neox(config, weights);
  ThreadPool pool(2);
  std::vector<int32_t> tokens = loaded.tokenizer->encode("Once upon a time, in a small town");
  EXPECT_LT(max_abs_diff(token_by_token(neox, tokens, pool), token_by_token(original, tokens, pool)), 1e-4f);
}

}  // namespace
}  // namespace sieve
