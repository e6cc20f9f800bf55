#pragma once
// Perplexity the way llama.cpp's llama-perplexity computes it, so results compare directly:
// the token stream is cut into chunks of n_ctx tokens; each chunk starts with BOS in place of
// its first token and is evaluated from an empty cache; only the second half is scored:
// for j = n_ctx/2 .. n_ctx-2 the logits at j predict token j+1.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/kv_cache.h"
#include "model/model.h"

namespace sieve::eval {

struct PerplexityResult {
  int64_t context = 0;
  int64_t num_chunks = 0;
  int64_t scored_tokens = 0;
  double mean_nll = 0.0;
  double ppl = 0.0;
  double ppl_stderr = 0.0;
  std::vector<double> running_ppl;  // after each chunk
  double seconds = 0.0;
};

// `tokens` is the whole tokenized text (BOS first). Throws sieve::Error when there is not one
// full chunk or context is not in [4, model context]. kv_dtype: the cache's element type
// (llama-perplexity's default is F16, sieve's f32: model::kKvDefaultDType); precise_kv_heads:
// a q8 / q4 cache keeps the model's precise streams in f16 too (engine::EngineConfig's).
PerplexityResult perplexity(const model::Model& model, std::span<const int32_t> tokens,
                            int32_t bos_id, int64_t context,
                            const std::function<void(const PerplexityResult&)>& on_chunk = {},
                            kernels::DType kv_dtype = model::kKvDefaultDType,
                            bool precise_kv_heads = true);

}  // namespace sieve::eval
