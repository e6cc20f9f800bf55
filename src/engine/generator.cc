#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "util/error.h"

namespace sieve::engine {

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

GenerationStats generate(const model::Model& model, std::span<const TokenId> prompt,
                         const GenerateOptions& options, const TokenCallback& on_token) {
  const int64_t context = model.config().context_length;
  if (prompt.empty()) fail("the prompt is empty (at least one token is needed)");
  if (static_cast<int64_t>(prompt.size()) > context) {
    fail("the prompt has {} tokens but the model's context is {}", prompt.size(), context);
  }
  const int64_t capacity =
      std::min<int64_t>(context, prompt.size() + std::max(0, options.max_tokens));
  auto [cache, block_table] = model::KvCache::for_one_sequence(model.backend(), model.config(),
                                                               static_cast<int32_t>(capacity));
  model::ForwardScratch scratch;
  Sampler sampler(options.sampling);
  std::vector<float> logits;
  model::Batch batch;
  batch.begin_sequence(block_table);
  for (size_t i = 0; i < prompt.size(); ++i)
    batch.add(prompt[i], static_cast<int32_t>(i), i + 1 == prompt.size());

  GenerationStats stats;
  stats.prompt_tokens = static_cast<int64_t>(prompt.size());
  auto start = std::chrono::steady_clock::now();
  model.forward(batch, cache, scratch, logits);
  stats.prompt_seconds = seconds_since(start);
  start = std::chrono::steady_clock::now();

  int32_t position = static_cast<int32_t>(prompt.size());
  for (int32_t i = 0; i < options.max_tokens; ++i) {
    const TokenId token = sampler.sample(logits);
    if (options.is_stop_token && options.is_stop_token(token)) break;
    ++stats.generated_tokens;
    if (!on_token(token, logits)) break;
    if (position >= capacity) break;  // context full
    batch.clear();
    batch.begin_sequence(block_table);
    batch.add(token, position++, true);
    model.forward(batch, cache, scratch, logits);
  }
  stats.generate_seconds = seconds_since(start);
  return stats;
}

}  // namespace sieve::engine
