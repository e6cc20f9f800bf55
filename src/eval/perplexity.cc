#include "eval/perplexity.h"

#include <chrono>
#include <cmath>

#include "engine/sampler.h"
#include "util/error.h"

namespace sieve::eval {

PerplexityResult perplexity(const model::Model& model, std::span<const int32_t> tokens,
                            int32_t bos_id, int64_t context,
                            const std::function<void(const PerplexityResult&)>& on_chunk,
                            kernels::DType kv_dtype, bool precise_kv_heads) {
  const model::ModelConfig& config = model.config();
  if (context < 4 || context > config.context_length) {
    fail("perplexity context {} must be in [4, {}] (the model's context)", context,
         config.context_length);
  }
  PerplexityResult result;
  result.context = context;
  result.num_chunks = static_cast<int64_t>(tokens.size()) / context;
  if (result.num_chunks == 0) {
    fail("the text has {} tokens, fewer than one chunk of {}", tokens.size(), context);
  }
  const auto start = std::chrono::steady_clock::now();
  auto [cache, block_table] =
      model::KvCache::for_one_sequence(model.backend(), config, static_cast<int32_t>(context), 16,
                                       kv_dtype, model.precise_kv_streams(kv_dtype));
  model::ForwardScratch scratch;
  std::vector<float> logits;
  const int64_t first_scored = context / 2;  // logits at first_scored predict token first_scored+1
  double sum_nll = 0.0, sum_nll2 = 0.0;

  for (int64_t chunk = 0; chunk < result.num_chunks; ++chunk) {
    std::span<const int32_t> window = tokens.subspan(chunk * context, context);
    model::Batch batch;
    batch.begin_sequence(block_table);
    for (int64_t j = 0; j < context; ++j) {
      const int32_t token = j == 0 ? bos_id : window[j];
      batch.add(token, static_cast<int32_t>(j), j >= first_scored && j <= context - 2);
    }
    model.forward(batch, cache, scratch, logits);
    for (int64_t j = first_scored; j <= context - 2; ++j) {
      std::span<const float> row(&logits[(j - first_scored) * config.vocab_size],
                                 config.vocab_size);
      const double nll = -engine::token_logprob(row, window[j + 1]);
      sum_nll += nll;
      sum_nll2 += nll * nll;
      ++result.scored_tokens;
    }
    result.running_ppl.push_back(std::exp(sum_nll / result.scored_tokens));
    if (on_chunk) on_chunk(result);
  }
  const double count = static_cast<double>(result.scored_tokens);
  result.mean_nll = sum_nll / count;
  result.ppl = std::exp(result.mean_nll);
  const double variance = sum_nll2 / count - result.mean_nll * result.mean_nll;
  result.ppl_stderr =
      count > 1 ? result.ppl * std::sqrt(std::max(0.0, variance) / (count - 1)) : 0.0;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace sieve::eval
