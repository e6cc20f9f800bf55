#include "eval/compare.h"

#include <cmath>

#include "engine/generator.h"
#include "engine/sampler.h"

namespace sieve::eval {

GreedyRun run_greedy(const model::Model& model, std::span<const int32_t> prompt,
                     int32_t num_tokens) {
  GreedyRun run;
  engine::GenerateOptions options{.max_tokens = num_tokens, .sampling = {.temperature = 0.0f}};
  engine::generate(model, prompt, options, [&](int32_t token, std::span<const float> logits) {
    run.tokens.push_back(token);
    run.logits.insert(run.logits.end(), logits.begin(), logits.end());
    return true;
  });
  return run;
}

ModelAgreement compare_models(const model::Model& reference, const model::Model& candidate,
                              const std::vector<std::vector<int32_t>>& prompts,
                              int32_t num_tokens) {
  ModelAgreement agreement;
  const int64_t vocab = reference.config().vocab_size;
  for (const std::vector<int32_t>& prompt : prompts) {
    GreedyRun ref = run_greedy(reference, prompt, num_tokens);
    GreedyRun own = run_greedy(candidate, prompt, num_tokens);
    for (size_t i = 0;
         i < ref.tokens.size() && i < own.tokens.size() && ref.tokens[i] == own.tokens[i]; ++i) {
      ++agreement.free_run_tokens;
    }
    agreement.free_run_total += static_cast<int64_t>(ref.tokens.size());

    // Teacher-forced: the candidate sees the reference's tokens, one batch for all steps.
    std::vector<int32_t> sequence = prompt;
    sequence.insert(sequence.end(), ref.tokens.begin(),
                    ref.tokens.end() - (ref.tokens.empty() ? 0 : 1));
    auto [cache, block_table] = model::KvCache::for_one_sequence(
        candidate.backend(), candidate.config(), static_cast<int32_t>(sequence.size()));
    model::ForwardScratch scratch;
    model::Batch batch;
    batch.begin_sequence(block_table);
    for (size_t j = 0; j < sequence.size(); ++j) {
      batch.add(sequence[j], static_cast<int32_t>(j), j + 1 >= prompt.size());
    }
    std::vector<float> logits;
    candidate.forward(batch, cache, scratch, logits);
    for (size_t step = 0; step < ref.tokens.size(); ++step) {
      std::span<const float> want(&ref.logits[step * vocab], vocab);
      std::span<const float> got(&logits[step * vocab], vocab);
      agreement.top1_matches += engine::argmax(got) == ref.tokens[step];
      ++agreement.steps;
      for (int64_t v = 0; v < vocab; ++v) {
        agreement.max_abs_logit_error = std::max(agreement.max_abs_logit_error,
                                                 std::fabs(static_cast<double>(want[v]) - got[v]));
      }
    }
  }
  return agreement;
}

}  // namespace sieve::eval
