// Properties of the forward pass that the golden tests do not pin down: batching across
// sequences, prefill vs token-by-token, and the two RoPE orderings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "kernels/backend.h"
#include "kernels/paged_attention.h"
#include "model/key_smoothing.h"
#include "model/kv_cache.h"
#include "model/llama.h"
#include "model/loader.h"
#include "shared_data.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace sieve {
namespace {

model::LoadedModel load() {
  return model::load_model({testing::shared_path("models/stories260K.gguf"), ""});
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float diff = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    diff = std::max(diff, std::fabs(a[i] - b[i]));
  return diff;
}

// Per row of `vocab` logits, whether `got`'s argmax is `want`'s, and KL(want || got) of their
// softmaxes: the count of agreeing rows and the KL summed over rows.
struct LogitAgreement {
  int64_t rows = 0, agree = 0;
  double kl_sum = 0;
};
LogitAgreement compare_logits(const std::vector<float>& want, const std::vector<float>& got,
                              int64_t vocab) {
  LogitAgreement r;
  r.rows = static_cast<int64_t>(std::min(want.size(), got.size())) / vocab;
  for (int64_t row = 0; row < r.rows; ++row) {
    const float* a = want.data() + row * vocab;
    const float* b = got.data() + row * vocab;
    r.agree += std::max_element(a, a + vocab) - a == std::max_element(b, b + vocab) - b;
    const double max_a = *std::max_element(a, a + vocab), max_b = *std::max_element(b, b + vocab);
    double sum_a = 0, sum_b = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      sum_a += std::exp(a[v] - max_a);
      sum_b += std::exp(b[v] - max_b);
    }
    for (int64_t v = 0; v < vocab; ++v) {
      const double la = a[v] - max_a - std::log(sum_a), lb = b[v] - max_b - std::log(sum_b);
      r.kl_sum += std::exp(la) * (la - lb);
    }
  }
  return r;
}

// Logits of every position of `tokens`, fed one token per forward call.
std::vector<float> token_by_token(const model::Model& m, const std::vector<int32_t>& tokens) {
  auto [cache, table] = model::KvCache::for_one_sequence(m.backend(), m.config(),
                                                         static_cast<int32_t>(tokens.size()));
  model::ForwardScratch scratch;
  std::vector<float> all, logits;
  for (size_t i = 0; i < tokens.size(); ++i) {
    model::Batch batch;
    batch.begin_sequence(table);
    batch.add(tokens[i], static_cast<int32_t>(i), true);
    m.forward(batch, cache, scratch, logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

TEST(Forward, PrefillBatchEqualsTokenByToken) {
  model::LoadedModel loaded = load();
  kernels::Backend& backend = loaded.model->backend();
  std::vector<int32_t> tokens =
      loaded.tokenizer->encode("Once upon a time there was a little girl named Lily.");
  auto [cache, table] = model::KvCache::for_one_sequence(backend, loaded.model->config(),
                                                         static_cast<int32_t>(tokens.size()), 4);
  model::ForwardScratch scratch;
  model::Batch batch;
  batch.begin_sequence(table);
  for (size_t i = 0; i < tokens.size(); ++i) batch.add(tokens[i], static_cast<int32_t>(i), true);
  std::vector<float> batched;
  loaded.model->forward(batch, cache, scratch, batched);
  EXPECT_LT(max_abs_diff(batched, token_by_token(*loaded.model, tokens)), 1e-4f);
}

// A sequence's n positions on the pages of `table` as streams of their own, every key kept in
// place (what chunk-by-chunk compression scores through); with `writes`, each position is also
// a new row of every stream (a forward step writes them).
model::SequenceKv streams_in_place(const model::KvCache& cache, std::span<const int32_t> table,
                                   int32_t n, bool writes) {
  model::SequenceKv kv;
  const kv::SliceShape shape = cache.slice_shape();
  const int32_t page_size = cache.page_size();
  for (int32_t s = 0; s < shape.num_streams(); ++s) {
    model::KvStream& stream = kv.streams.emplace_back();
    for (int32_t page : table)
      stream.slices.push_back(static_cast<int32_t>(shape.dense_slice(kv::PageId{page}, s).value));
    stream.num_keys = n;
    for (int32_t i = 0; writes && i < n; ++i) {
      stream.new_rows.emplace_back(stream.slices[static_cast<size_t>(i / page_size)],
                                   i % page_size);
    }
  }
  return kv;
}

TEST(Observe, ScoresOfASequenceThroughItsStreamsEqualTheDensePass) {
  // Chunk-by-chunk compression scores a compressed sequence through its per-(layer, KV head)
  // streams; with every key kept in place they must be the dense observation scores.
  model::LoadedModel loaded = load();
  const model::Model& m = *loaded.model;
  kernels::Backend& backend = loaded.model->backend();
  std::vector<int32_t> tokens = loaded.tokenizer->encode(
      "Once upon a time there was a little girl named Lily. She liked to play outside in the park "
      "with her dog.");
  const auto n = static_cast<int32_t>(tokens.size());
  auto [cache, table] = model::KvCache::for_one_sequence(backend, m.config(), n, 8);
  model::ForwardScratch scratch;
  model::Batch batch;
  batch.begin_sequence(table);
  for (int32_t i = 0; i < n; ++i) batch.add(tokens[i], i, false);
  std::vector<float> logits;
  m.forward(batch, cache, scratch, logits);

  const int32_t window = 6;
  std::vector<int32_t> positions;
  for (int32_t i = n - window; i < n; ++i) positions.push_back(i);
  const std::span<const int32_t> window_tokens =
      std::span<const int32_t>(tokens).subspan(n - window);
  std::vector<float> dense, streamed;
  m.observe(window_tokens, positions, {.block_table = table}, cache, scratch, dense);

  m.observe(window_tokens, positions, streams_in_place(cache, table, n, false), cache, scratch,
            streamed);
  ASSERT_EQ(streamed.size(), dense.size());
  EXPECT_LT(max_abs_diff(streamed, dense), 1e-4f);  // the kernels tile one head vs all heads
  float total = 0;
  for (float score : dense) total += score;
  // Every row's probabilities sum to 1 per query head: window rows x query heads in all.
  EXPECT_NEAR(total, static_cast<float>(window * m.config().num_heads * m.config().num_layers),
              1e-2f);
}

TEST(Observe, TheWindowScoredInItsOwnForwardStepEqualsObserve) {
  // A prompt chunk that ends where the prompt is compressed scores its last rows in its own
  // step (SequenceKv::observe_rows), instead of observe() running them again after it: the
  // same scores, dense or through streams of their own, in the same order.
  model::LoadedModel loaded = load();
  const model::Model& m = *loaded.model;
  std::vector<int32_t> tokens = loaded.tokenizer->encode(
      "Once upon a time there was a little girl named Lily. She liked to play outside in the park "
      "with her dog.");
  const auto n = static_cast<int32_t>(tokens.size());
  const int32_t window = 6;
  auto [cache, table] = model::KvCache::for_one_sequence(m.backend(), m.config(), n, 8);
  const model::SequenceKv sparse = streams_in_place(cache, table, n, true);
  std::vector<int32_t> positions;
  for (int32_t i = n - window; i < n; ++i) positions.push_back(i);
  const std::span<const int32_t> window_tokens =
      std::span<const int32_t>(tokens).subspan(n - window);
  for (bool dense : {true, false}) {
    model::SequenceKv kv = dense ? model::SequenceKv{.block_table = table} : sparse;
    kv.observe_rows = window;
    model::ForwardScratch scratch;
    model::Batch batch;
    batch.begin_sequence(kv);
    for (int32_t i = 0; i < n; ++i) batch.add(tokens[i], i, i + 1 == n);
    std::vector<float> logits, observed;
    std::vector<model::StreamOutputs> outputs;
    m.forward(batch, cache, scratch, logits, &outputs);
    ASSERT_EQ(outputs.size(), 1u);
    EXPECT_EQ(outputs[0].observed_rows, window);
    EXPECT_EQ(outputs[0].observed_through, n);
    kv.observe_rows = 0;
    m.observe(window_tokens, positions, kv, cache, scratch, observed);
    ASSERT_EQ(outputs[0].observed.size(), observed.size()) << dense;
    // The window's log-sum-exps come from a chunk of n rows there and of `window` rows here.
    EXPECT_LT(max_abs_diff(outputs[0].observed, observed), 1e-5f) << dense;
  }
}

TEST(Observe, KeysReadThroughStreamsOrTheBlockTableAreTheCachesKeys) {
  // KV policies that score keys themselves (KeyDiff) read them per stream, in stream order.
  model::LoadedModel loaded = load();
  const model::Model& m = *loaded.model;
  const model::ModelConfig& c = m.config();
  std::vector<int32_t> tokens = loaded.tokenizer->encode("Once upon a time there was a cat.");
  const auto n = static_cast<int32_t>(tokens.size());
  auto [cache, table] = model::KvCache::for_one_sequence(m.backend(), c, n, 4);
  model::ForwardScratch scratch;
  model::Batch batch;
  batch.begin_sequence(table);
  for (int32_t i = 0; i < n; ++i) batch.add(tokens[i], i, false);
  std::vector<float> logits;
  m.forward(batch, cache, scratch, logits);

  std::vector<float> dense, streamed;
  m.read_keys({.block_table = table}, n, cache, scratch, dense);
  ASSERT_EQ(std::ssize(dense), c.num_layers * c.num_kv_heads * n * c.head_dim);
  std::vector<float> want(static_cast<size_t>(c.head_dim));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      for (int32_t t = 0; t < n; ++t) {
        kernels::load_kv_row(cache.layer_view(l, table), /*value=*/false, t, h, want.data());
        const auto at = static_cast<size_t>(((l * c.num_kv_heads + h) * n + t) * c.head_dim);
        EXPECT_TRUE(
            std::equal(want.begin(), want.end(), dense.begin() + static_cast<ptrdiff_t>(at)))
            << l << " " << h << " " << t;
      }
    }
  }
  model::SequenceKv sparse;
  const kv::SliceShape shape = cache.slice_shape();
  for (int32_t s = 0; s < shape.num_streams(); ++s) {
    model::KvStream& stream = sparse.streams.emplace_back();
    for (int32_t page : table)
      stream.slices.push_back(static_cast<int32_t>(shape.dense_slice(kv::PageId{page}, s).value));
    stream.num_keys = n;
  }
  m.read_keys(sparse, n, cache, scratch, streamed);
  EXPECT_EQ(streamed, dense);
}

// q8 / q4 caches store keys smoothed (shifted, scaled per channel) and rotated; policies read
// them back as the model computed them, up to the dtype's rounding (copy-lm, q8: every head
// smoothed and rotated).
TEST(Observe, KeysReadFromAQuantizedCacheAreTheModelsKeys) {
  model::LoadedModel loaded =
      model::load_model({testing::shared_path("models/copy/copy-lm.gguf"), ""});
  const model::Model& m = *loaded.model;
  const std::vector<int32_t> tokens = loaded.tokenizer->encode(
      "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.");
  const auto n = static_cast<int32_t>(tokens.size());
  const auto keys_of = [&](kernels::DType dtype) {
    auto [cache, table] = model::KvCache::for_one_sequence(m.backend(), m.config(), n, 16, dtype);
    model::ForwardScratch scratch;
    model::Batch batch;
    batch.begin_sequence(table);
    for (int32_t i = 0; i < n; ++i) batch.add(tokens[i], i, false);
    std::vector<float> logits, keys;
    m.forward(batch, cache, scratch, logits);
    m.read_keys({.block_table = table}, n, cache, scratch, keys);
    return keys;
  };
  const std::vector<float> f32 = keys_of(kernels::DType::kF32);
  const std::vector<float> q8 = keys_of(kernels::DType::kQ8_0);
  ASSERT_EQ(q8.size(), f32.size());
  float largest = 0;
  for (float x : f32) largest = std::max(largest, std::fabs(x));
  const float error = max_abs_diff(f32, q8);
  std::printf("keys read from q8 pages: max |diff| %.4f of keys up to %.2f\n", error, largest);
  EXPECT_GT(error, 0.0f);
  EXPECT_LT(error, 0.02f * largest);
}

TEST(Forward, RaggedBatchOfSequencesEqualsEachAlone) {
  model::LoadedModel loaded = load();
  kernels::Backend& backend = loaded.model->backend();
  const std::vector<std::string> prompts = {"Once upon a time",
                                            "The dog ran to the big red ball and", "Sara"};
  // Pages of 4 tokens, handed out interleaved and out of order between the sequences.
  model::KvCache cache(backend, loaded.model->config(), 16, 4);
  const std::vector<std::vector<int32_t>> tables = {{9, 2, 14}, {5, 11, 0, 7, 3}, {12}};
  model::ForwardScratch scratch;
  model::Batch batch;
  std::vector<std::vector<int32_t>> encoded;
  for (size_t s = 0; s < prompts.size(); ++s) {
    encoded.push_back(loaded.tokenizer->encode(prompts[s]));
    ASSERT_LE(encoded[s].size(), tables[s].size() * 4);
    batch.begin_sequence(tables[s]);
    for (size_t i = 0; i < encoded[s].size(); ++i)
      batch.add(encoded[s][i], static_cast<int32_t>(i), true);
  }
  std::vector<float> batched;
  loaded.model->forward(batch, cache, scratch, batched);
  const int64_t vocab = loaded.model->config().vocab_size;
  size_t row = 0;
  for (size_t s = 0; s < prompts.size(); ++s) {
    std::vector<float> alone = token_by_token(*loaded.model, encoded[s]);
    std::vector<float> mine(batched.begin() + row * vocab,
                            batched.begin() + (row + encoded[s].size()) * vocab);
    EXPECT_LT(max_abs_diff(mine, alone), 1e-4f) << prompts[s];
    row += encoded[s].size();
  }
}

// An f16 KV cache (pages interleaved between sequences, as above) gives the f32 cache's logits
// up to f16 rounding of K and V, and the same greedy token at every position.
TEST(Forward, F16KvCacheMatchesF32WithinF16Rounding) {
  model::LoadedModel loaded = load();
  kernels::Backend& backend = loaded.model->backend();
  const std::vector<std::string> prompts = {"Once upon a time there was a little girl named Lily.",
                                            "Sara"};
  const std::vector<std::vector<int32_t>> tables = {{9, 2, 14, 1, 6}, {5}};
  std::vector<float> logits[2];
  for (kernels::DType dtype : {kernels::DType::kF32, kernels::DType::kF16}) {
    model::KvCache cache(backend, loaded.model->config(), 16, 4, dtype);
    EXPECT_EQ(cache.dtype(), dtype);
    model::ForwardScratch scratch;
    model::Batch batch;
    for (size_t s = 0; s < prompts.size(); ++s) {
      const std::vector<int32_t> tokens = loaded.tokenizer->encode(prompts[s]);
      ASSERT_LE(tokens.size(), tables[s].size() * 4);
      batch.begin_sequence(tables[s]);
      for (size_t i = 0; i < tokens.size(); ++i)
        batch.add(tokens[i], static_cast<int32_t>(i), true);
    }
    loaded.model->forward(batch, cache, scratch, logits[dtype == kernels::DType::kF16]);
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  const float diff = max_abs_diff(logits[0], logits[1]);
  EXPECT_GT(diff, 0.0f);   // the f16 cache is really used
  EXPECT_LT(diff, 2e-2f);  // logits of order 10; f16 keeps 11 bits
  const int64_t vocab = loaded.model->config().vocab_size;
  for (size_t row = 0; row < logits[0].size() / vocab; ++row) {
    const auto argmax = [&](const std::vector<float>& l) {
      return std::max_element(l.begin() + row * vocab, l.begin() + (row + 1) * vocab) - l.begin();
    };
    EXPECT_EQ(argmax(logits[0]), argmax(logits[1])) << "row " << row;
  }
  EXPECT_EQ(model::KvCache::bytes_per_page(loaded.model->config(), 16, kernels::DType::kF16) * 2,
            model::KvCache::bytes_per_page(loaded.model->config(), 16, kernels::DType::kF32));
}

struct KvFidelity {
  double agreement = 0, mean_kl = 0;
  float logit_diff = 0, score_diff = 0;
};

// A KV dtype against the f32 cache on `model`: every position's logits of a prefill over
// held-out text (teacher forcing: the same tokens) and the observation scores of the last 8
// rows (observe(): the transformed queries against the stored keys, as SnapKV / H2O score).
// Top-1 agreement, mean KL(f32 || dtype), max |logit diff| and max |observation score diff|
// over `prompts` prompts of `length` tokens, printed.
std::map<kernels::DType, KvFidelity> kv_fidelity(const std::string& model_path, int32_t prompts,
                                                 int32_t length, bool precise_streams = false) {
  model::LoadedModel loaded = model::load_model({model_path, ""});
  const model::ModelConfig& mc = loaded.model->config();
  std::ifstream in(testing::shared_path("models/copy/heldout.txt"));
  std::stringstream text;
  text << in.rdbuf();
  const std::vector<int32_t> all = loaded.tokenizer->encode(text.str());
  constexpr int32_t kWindow = 8;
  EXPECT_GE(all.size(), static_cast<size_t>(prompts * length));
  if (all.size() < static_cast<size_t>(prompts * length)) return {};
  const int64_t vocab = mc.vocab_size;
  struct Run {
    std::vector<float> logits, scores;
  };
  const auto run = [&](kernels::DType dtype, int32_t p) {
    auto [cache, table] = model::KvCache::for_one_sequence(
        loaded.model->backend(), mc, length, 16, dtype,
        precise_streams ? loaded.model->precise_kv_streams(dtype) : std::vector<int32_t>{});
    model::ForwardScratch scratch;
    model::Batch batch;
    batch.begin_sequence(table);
    for (int32_t i = 0; i < length; ++i) batch.add(all[p * length + i], i, true);
    Run r;
    loaded.model->forward(batch, cache, scratch, r.logits);
    std::vector<int32_t> window_tokens, window_positions;
    for (int32_t i = length - kWindow; i < length; ++i) {
      window_tokens.push_back(all[p * length + i]);
      window_positions.push_back(i);
    }
    loaded.model->observe(window_tokens, window_positions, {.block_table = table}, cache, scratch,
                          r.scores);
    return r;
  };
  std::vector<Run> reference;
  for (int32_t p = 0; p < prompts; ++p) reference.push_back(run(kernels::DType::kF32, p));
  std::map<kernels::DType, KvFidelity> result;
  for (kernels::DType dtype :
       {kernels::DType::kF16, kernels::DType::kQ8_0, kernels::DType::kQ4_1}) {
    KvFidelity& f = result[dtype];
    int64_t agree = 0, positions = 0;
    for (int32_t p = 0; p < prompts; ++p) {
      const Run& want = reference[p];
      const Run got = run(dtype, p);
      f.logit_diff = std::max(f.logit_diff, max_abs_diff(want.logits, got.logits));
      f.score_diff = std::max(f.score_diff, max_abs_diff(want.scores, got.scores));
      const LogitAgreement a = compare_logits(want.logits, got.logits, vocab);
      agree += a.agree;
      f.mean_kl += a.kl_sum;
      positions += a.rows;
    }
    f.agreement = static_cast<double>(agree) / static_cast<double>(positions);
    f.mean_kl /= static_cast<double>(positions);
    std::printf(
        "%s KV%s vs f32: top-1 agreement %.4f, mean KL %.2e, max |logit diff| %.3f, "
        "max |observation score diff| %.4f\n",
        std::string(model::kv_dtype_name(dtype)).c_str(),
        precise_streams ? " (precise streams)" : "", f.agreement, f.mean_kl, f.logit_diff,
        f.score_diff);
    EXPECT_GT(f.logit_diff, 0.0f) << "the cache's dtype is really used";
  }
  return result;
}

// copy-lm (a trained llama, head_dim 32) attends sharply (it copies spans) with large keys (rms
// up to ~6 in its low-frequency RoPE channels), so small key errors move its attention: measured
// (4 prompts of 256 tokens, printed) top-1 agreement / mean KL (nats) / max |logit diff|:
// f16 0.997 / 4e-6 / 0.04, q8 0.980 / 5.0e-4 / 0.41, q4 0.798 / 0.086 / 6.1. Without the key
// smoothing (llama.cc; rotation only) q8 0.972 / 1.2e-3 / 1.0, q4 0.662 / 0.26 / 9.0: the KL
// bounds below fail without it. They leave room around those numbers.
TEST(Forward, QuantizedKvCachesTrackF32OnATrainedModel) {
  {
    // No head of copy-lm costs 20x its median (at most 4.6x at q8, 5.5x at q4): none kept in f16.
    model::LoadedModel loaded =
        model::load_model({testing::shared_path("models/copy/copy-lm.gguf"), ""});
    for (kernels::DType dtype : {kernels::DType::kQ8_0, kernels::DType::kQ4_1})
      EXPECT_TRUE(loaded.model->precise_kv_streams(dtype).empty()) << model::kv_dtype_name(dtype);
  }
  auto f = kv_fidelity(testing::shared_path("models/copy/copy-lm.gguf"), 4, 256);
  ASSERT_EQ(f.size(), 3u);
  const KvFidelity &q8 = f[kernels::DType::kQ8_0], &q4 = f[kernels::DType::kQ4_1];
  EXPECT_GE(q8.agreement, 0.97);
  EXPECT_LT(q8.mean_kl, 8e-4);
  EXPECT_LT(q8.logit_diff, 1.0f);
  EXPECT_LT(q8.score_diff, 0.2f);
  EXPECT_GE(q4.agreement, 0.75);
  EXPECT_LT(q4.mean_kl, 0.15);
  EXPECT_LT(q4.score_diff, 1.5f);
  // Each dtype's error is above the finer one's.
  EXPECT_LT(f[kernels::DType::kF16].mean_kl, q8.mean_kl);
  EXPECT_LT(q8.mean_kl, q4.mean_kl);
  EXPECT_LE(f[kernels::DType::kF16].score_diff, q8.score_diff);
  EXPECT_LE(q8.score_diff, q4.score_diff);
}

// The evaluation model (models/eval-32k.gguf, head_dim 64) has a hand-wired induction head
// (layer 1, kv head 0) whose keys are a few +-4 codes and whose scores reach ~100 logits. Its
// keys round almost exactly at 4 bits as they are and badly once smoothed and rotated, so a q4
// cache leaves that head plain (key_smoothing.h) and smooths and rotates the others; q8 keeps
// every head smoothed and rotated (plain did not carry over to long prompts there). Measured
// (4 prompts of 512 tokens of copy-lm's held-out text, printed) top-1 / mean KL / max |logit
// diff|: f16 0.996 / 2.4e-4 / 0.50, q8 0.952 / 1.0e-2 / 3.1, q4 0.984 / 1.0e-3 / 1.08; q4 with
// every head smoothed and rotated 0.837 / 0.19 / 12.7, which the q4 bounds below reject.
TEST(Forward, QuantizedKvCachesTrackF32OnTheEvaluationModel) {
  const std::string path = std::string(SIEVE_SOURCE_DIR) + "/models/eval-32k.gguf";
  {
    model::LoadedModel loaded = model::load_model({path, ""});
    for (kernels::DType dtype : {kernels::DType::kQ8_0, kernels::DType::kQ4_1}) {
      auto [cache, table] = model::KvCache::for_one_sequence(loaded.model->backend(),
                                                             loaded.model->config(), 16, 16, dtype);
      loaded.model->prepare_cache(cache);
      ASSERT_NE(cache.key_smoothing(), nullptr);
      for (int64_t layer = 0; layer < loaded.model->config().num_layers; ++layer) {
        for (int64_t h = 0; h < loaded.model->config().num_kv_heads; ++h) {
          const bool plain = dtype == kernels::DType::kQ4_1 && layer == 1 && h == 0;
          EXPECT_EQ(cache.key_smoothing()->rotates(layer, h), !plain)
              << model::kv_dtype_name(dtype) << " layer " << layer << " kv head " << h;
        }
      }
      // The wired head (stream 1 * 2 + 0) is the one both dtypes keep in f16 as well.
      EXPECT_EQ(loaded.model->precise_kv_streams(dtype), std::vector<int32_t>{2})
          << model::kv_dtype_name(dtype);
    }
    EXPECT_TRUE(loaded.model->precise_kv_streams(kernels::DType::kF16).empty());
  }
  auto f = kv_fidelity(path, 4, 512);
  ASSERT_EQ(f.size(), 3u);
  const KvFidelity &q8 = f[kernels::DType::kQ8_0], &q4 = f[kernels::DType::kQ4_1];
  EXPECT_LT(f[kernels::DType::kF16].mean_kl, q4.mean_kl);
  EXPECT_GE(q8.agreement, 0.94);
  EXPECT_LT(q8.mean_kl, 1.5e-2);
  EXPECT_GE(q4.agreement, 0.97);
  EXPECT_LT(q4.mean_kl, 3e-3);
  EXPECT_LT(q4.logit_diff, 2.5f);
  // With the wired head's dense rows read from f16 (the observation scores too), q8 comes to
  // f16's error and q4 closer to it: measured q8 0.998 / 3.0e-5 / 0.28 (observation scores
  // 0.09), q4 0.990 / 6.1e-4 / 0.71.
  auto precise = kv_fidelity(path, 4, 512, /*precise_streams=*/true);
  ASSERT_EQ(precise.size(), 3u);
  const KvFidelity &f16 = precise[kernels::DType::kF16], &p8 = precise[kernels::DType::kQ8_0],
                   &p4 = precise[kernels::DType::kQ4_1];
  EXPECT_GE(p8.agreement, f16.agreement - 0.005);
  EXPECT_LT(p8.mean_kl, q8.mean_kl / 10);
  EXPECT_LT(p4.mean_kl, q4.mean_kl);
  EXPECT_LT(p8.score_diff, q8.score_diff);
}

// --prefill-attention (a CPU backend whose attention jobs carry AttentionQuery::prefill_dots)
// against f32 on two trained models: every position's logits of prefills of held-out text (each
// forward call one 512-token chunk: a long job), top-1 agreement, mean KL(f32 || bf16) and max
// |logit diff|, printed. Measured on Zen 4 (2 prompts each): bf16-pv copy-lm 0.997 / 1.4e-5 /
// 0.08, eval-32k 0.995 / 1.6e-4 / 0.41 (f16 KV's error, above); bf16 copy-lm 0.987 / 2.9e-4 /
// 0.32, eval-32k 0.953 / 1.3e-2 / 3.9 (q8 KV's: its wired head's scores reach ~100, and a bf16 key
// keeps 8 bits). On a CPU without AVX512-BF16 the logits are f32's, bit for bit.
TEST(Forward, Bf16PrefillAttentionTracksF32OnTrainedModels) {
  std::ifstream in(testing::shared_path("models/copy/heldout.txt"));
  std::stringstream text;
  text << in.rdbuf();
  constexpr int32_t kLength = 512, kPrompts = 2;
  using kernels::PrefillDots;
  for (const std::string& path : {testing::shared_path("models/copy/copy-lm.gguf"),
                                  std::string(SIEVE_SOURCE_DIR) + "/models/eval-32k.gguf"}) {
    std::map<PrefillDots, std::vector<float>> logits;
    int64_t vocab = 0;
    for (PrefillDots dots : {PrefillDots::kF32, PrefillDots::kBf16Pv, PrefillDots::kBf16}) {
      model::LoadedModel loaded =
          model::load_model({.model_path = path, .backend = {.threads = 2, .prefill_dots = dots}});
      const model::ModelConfig& mc = loaded.model->config();
      vocab = mc.vocab_size;
      const std::vector<int32_t> all = loaded.tokenizer->encode(text.str());
      ASSERT_GE(all.size(), static_cast<size_t>(kPrompts * kLength));
      for (int32_t p = 0; p < kPrompts; ++p) {
        auto [cache, table] =
            model::KvCache::for_one_sequence(loaded.model->backend(), mc, kLength, 16);
        model::ForwardScratch scratch;
        model::Batch batch;
        batch.begin_sequence(table);
        for (int32_t i = 0; i < kLength; ++i) batch.add(all[p * kLength + i], i, true);
        std::vector<float> out;
        loaded.model->forward(batch, cache, scratch, out);
        logits[dots].insert(logits[dots].end(), out.begin(), out.end());
      }
    }
    const std::vector<float>& want = logits[PrefillDots::kF32];
    std::map<PrefillDots, double> kl;
    for (PrefillDots dots : {PrefillDots::kBf16Pv, PrefillDots::kBf16}) {
      const std::vector<float>& got = logits[dots];
      const float diff = max_abs_diff(want, got);
      if (!kernels::bf16_attention_supported()) {
        EXPECT_EQ(diff, 0.0f) << path;
        continue;
      }
      const LogitAgreement a = compare_logits(want, got, vocab);
      ASSERT_GT(a.rows, 0) << path;
      const double mean_kl = a.kl_sum / static_cast<double>(a.rows);
      kl[dots] = mean_kl;
      const double agreement = static_cast<double>(a.agree) / static_cast<double>(a.rows);
      const std::string name(kernels::prefill_dots_name(dots));
      std::printf(
          "%s %s prefill attention vs f32: top-1 agreement %.4f, mean KL %.2e, "
          "max |logit diff| %.3f\n",
          path.c_str(), name.c_str(), agreement, mean_kl, diff);
      EXPECT_GT(diff, 0.0f) << path << " " << name << ": the bf16 dot products are really used";
      const bool pv = dots == PrefillDots::kBf16Pv;
      EXPECT_GE(agreement, pv ? 0.985 : 0.93) << path << " " << name;
      EXPECT_LT(mean_kl, pv ? 1e-3 : 3e-2) << path << " " << name;
    }
    if (kernels::bf16_attention_supported()) {
      EXPECT_LT(kl[PrefillDots::kBf16Pv], kl[PrefillDots::kBf16]) << path;
    }
  }
}

// A q8 cache whose every stream is precise attends dense sequences from f16 rows alone: the
// logits are an f16 cache's up to the rounding of the transformed (smoothed, rotated) keys,
// against f32 about as far as f16's, far closer than plain q8's.
TEST(Forward, EveryStreamPreciseAttendsLikeAnF16Cache) {
  model::LoadedModel loaded =
      model::load_model({testing::shared_path("models/copy/copy-lm.gguf"), ""});
  const model::ModelConfig& mc = loaded.model->config();
  const std::vector<int32_t> prompt = loaded.tokenizer->encode(
      "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.");
  const auto n = static_cast<int32_t>(prompt.size());
  const auto logits_of = [&](kernels::DType dtype, std::vector<int32_t> precise) {
    auto [cache, table] = model::KvCache::for_one_sequence(loaded.model->backend(), mc, n, 16,
                                                           dtype, std::move(precise));
    model::ForwardScratch scratch;
    model::Batch batch;
    batch.begin_sequence(table);
    for (int32_t i = 0; i < n; ++i) batch.add(prompt[i], i, true);
    std::vector<float> logits;
    loaded.model->forward(batch, cache, scratch, logits);
    return logits;
  };
  std::vector<int32_t> all(static_cast<size_t>(mc.num_layers * mc.num_kv_heads));
  for (size_t s = 0; s < all.size(); ++s) all[s] = static_cast<int32_t>(s);
  const std::vector<float> f32 = logits_of(kernels::DType::kF32, {});
  const float f16 = max_abs_diff(f32, logits_of(kernels::DType::kF16, {}));
  const float q8 = max_abs_diff(f32, logits_of(kernels::DType::kQ8_0, {}));
  const float precise = max_abs_diff(f32, logits_of(kernels::DType::kQ8_0, all));
  std::printf("max |logit diff| against f32: f16 %.4f, q8 %.4f, q8 every stream precise %.4f\n",
              f16, q8, precise);
  EXPECT_GT(precise, 0.0f);
  EXPECT_LT(precise, 2 * f16 + 1e-3f);
  EXPECT_LT(precise, q8 / 4);
}

// A sparse sequence's precise streams attend their f16 areas (kv/precise_areas.h): slices and
// areas scattered over the pool (pages in reverse order, areas alternating between spares and
// another page's areas) give the dense precise cache's logits, and far closer to f32 than the
// same streams reading their q8 rows.
TEST(Forward, SparsePreciseStreamsAttendTheirF16Areas) {
  model::LoadedModel loaded =
      model::load_model({testing::shared_path("models/copy/copy-lm.gguf"), ""});
  const model::ModelConfig& mc = loaded.model->config();
  kernels::Backend& backend = loaded.model->backend();
  const std::vector<int32_t> prompt = loaded.tokenizer->encode(
      "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.");
  const auto n = static_cast<int32_t>(prompt.size());
  constexpr int32_t kPageSize = 4;
  const int32_t num_blocks = (n + kPageSize - 1) / kPageSize;
  const int32_t num_pages = 2 * num_blocks;
  const auto num_streams = static_cast<int32_t>(mc.num_layers * mc.num_kv_heads);
  std::vector<int32_t> all(static_cast<size_t>(num_streams));
  for (int32_t s = 0; s < num_streams; ++s) all[static_cast<size_t>(s)] = s;
  const int32_t num_spare = num_streams * num_blocks;
  const auto run = [&](kernels::DType dtype, bool sparse, bool areas) {
    model::KvCache cache(backend, mc, num_pages, kPageSize, dtype,
                         dtype == kernels::DType::kF32 ? std::vector<int32_t>{} : all, num_spare);
    model::Batch batch;
    if (!sparse) {
      std::vector<int32_t> table(static_cast<size_t>(num_blocks));
      for (int32_t b = 0; b < num_blocks; ++b) table[static_cast<size_t>(b)] = b;
      batch.begin_sequence(table);
    } else {
      const kv::SliceShape shape = cache.slice_shape();
      model::SequenceKv kv;
      for (int32_t s = 0; s < num_streams; ++s) {
        model::KvStream& stream = kv.streams.emplace_back();
        for (int32_t b = 0; b < num_blocks; ++b) {
          const kv::PageId page{num_pages - 1 - b};
          stream.slices.push_back(static_cast<int32_t>(shape.dense_slice(page, s).value));
          if (!areas) continue;
          // Spare (s, b), or the area of rank (s + 1) % S of page b.
          stream.areas.push_back(b % 2 ? num_streams * num_pages + s * num_blocks + b
                                       : ((s + 1) % num_streams) * num_pages + b);
        }
        stream.num_keys = n;
        for (int32_t i = 0; i < n; ++i) {
          stream.new_rows.emplace_back(stream.slices[static_cast<size_t>(i / kPageSize)],
                                       i % kPageSize);
          if (areas)
            stream.new_area_rows.emplace_back(stream.areas[static_cast<size_t>(i / kPageSize)],
                                              i % kPageSize);
        }
      }
      batch.begin_sequence(std::move(kv));
    }
    for (int32_t i = 0; i < n; ++i) batch.add(prompt[i], i, true);
    model::ForwardScratch scratch;
    std::vector<float> logits;
    loaded.model->forward(batch, cache, scratch, logits);
    return logits;
  };
  const std::vector<float> f32 = run(kernels::DType::kF32, false, false);
  const std::vector<float> dense = run(kernels::DType::kQ8_0, false, false);
  const std::vector<float> with_areas = run(kernels::DType::kQ8_0, true, true);
  const std::vector<float> q8_rows = run(kernels::DType::kQ8_0, true, false);
  const float areas_error = max_abs_diff(f32, with_areas), rows_error = max_abs_diff(f32, q8_rows);
  std::printf(
      "max |logit diff| against f32: sparse with f16 areas %.4f, reading q8 rows %.4f; "
      "against the dense precise cache %.2g\n",
      areas_error, rows_error, max_abs_diff(dense, with_areas));
  EXPECT_LT(max_abs_diff(dense, with_areas), 1e-4f);
  EXPECT_GT(areas_error, 0.0f);
  EXPECT_LT(areas_error, rows_error / 4);
}

// copy_page duplicates a page in every layer, for both element types.
TEST(KvCache, CopyPageCopiesEveryLayer) {
  model::LoadedModel loaded = load();
  const model::ModelConfig& config = loaded.model->config();
  kernels::Backend& backend = loaded.model->backend();
  for (kernels::DType dtype : {kernels::DType::kF32, kernels::DType::kF16}) {
    model::KvCache cache(backend, config, 4, 2, dtype);
    const std::vector<int32_t> src_table = {1}, dst_table = {3};
    std::vector<float> k(config.kv_dim()), v(config.kv_dim());
    for (int64_t layer = 0; layer < config.num_layers; ++layer) {
      for (int32_t pos = 0; pos < 2; ++pos) {
        for (size_t i = 0; i < k.size(); ++i) {
          k[i] = static_cast<float>(layer * 100 + pos * 10) + static_cast<float>(i) * 0.25f;
          v[i] = -k[i];
        }
        cache.write(layer, src_table, pos, k.data(), v.data());
      }
    }
    cache.copy_page(1, 3);
    std::vector<float> want(config.head_dim), got(config.head_dim);
    for (int64_t layer = 0; layer < config.num_layers; ++layer) {
      for (int32_t pos = 0; pos < 2; ++pos) {
        for (int64_t h = 0; h < config.num_kv_heads; ++h) {
          for (bool value : {false, true}) {
            kernels::load_kv_row(cache.layer_view(layer, src_table), value, pos, h, want.data());
            kernels::load_kv_row(cache.layer_view(layer, dst_table), value, pos, h, got.data());
            EXPECT_EQ(want, got) << "layer " << layer << " pos " << pos << " head " << h;
            const float first =
                static_cast<float>(layer * 100 + pos * 10) + h * config.head_dim * 0.25f;
            EXPECT_EQ(got[0], value ? -first : first);
          }
        }
      }
    }
  }
}

TEST(Forward, RejectsPositionsOutsideTheBlockTableBadPagesAndBadTokens) {
  model::LoadedModel loaded = load();
  kernels::Backend& backend = loaded.model->backend();
  model::KvCache cache(backend, loaded.model->config(), 2, 4);
  model::ForwardScratch scratch;
  std::vector<float> logits;
  model::Batch batch;
  batch.begin_sequence({0});
  batch.add(1, 4, true);  // the block table covers positions 0..3
  EXPECT_THROW(loaded.model->forward(batch, cache, scratch, logits), Error);
  batch.clear();
  batch.begin_sequence({0});
  batch.add(512, 0, true);  // vocabulary has 512 tokens
  EXPECT_THROW(loaded.model->forward(batch, cache, scratch, logits), Error);
  batch.clear();
  batch.begin_sequence({2});  // page 2 does not exist
  batch.add(1, 0, true);
  EXPECT_THROW(loaded.model->forward(batch, cache, scratch, logits), Error);
}

// The same model with Q/K rows permuted from adjacent-pair to half-split order and NeoX RoPE
// computes exactly the same function.
TEST(Forward, NeoxOrderingOnPermutedWeightsMatchesNormal) {
  model::LoadedModel loaded = load();
  const model::Model& original = *loaded.model;
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
        std::copy_n(src + (h * hd + 2 * i + 1) * m.cols, m.cols,
                    out.data() + (h * hd + i + half) * m.cols);
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
  weights.storage = std::make_shared<std::pair<std::shared_ptr<const void>, decltype(buffers)>>(
      weights.storage, buffers);
  model::LlamaModel neox(config, weights, kernels::make_cpu_backend(2));
  std::vector<int32_t> tokens = loaded.tokenizer->encode("Once upon a time, in a small town");
  EXPECT_LT(max_abs_diff(token_by_token(neox, tokens), token_by_token(original, tokens)), 1e-4f);
}

}  // namespace
}  // namespace sieve
