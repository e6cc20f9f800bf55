#include "eval/calibration.h"

#include <fmt/format.h>

#include <memory>

#include "sparsity/selection.h"
#include "util/error.h"

namespace sieve::eval {

sparsity::CalibrationProfile calibrate(const model::Model& model, const std::string& model_name,
                                       std::span<const std::vector<int32_t>> prompts,
                                       const CalibrationConfig& config) {
  const model::ModelConfig& c = model.config();
  if (prompts.empty()) fail("calibration needs at least one prompt");
  if (config.observation_rows < 1) fail("calibration needs at least one observation row");
  const int64_t num_cells = c.num_layers * c.num_kv_heads;
  std::vector<double> sums(static_cast<size_t>(num_cells), 0.0);
  model::ForwardScratch scratch;
  std::vector<float> logits, scores;
  for (const std::vector<int32_t>& prompt : prompts) {
    const auto n = static_cast<int32_t>(prompt.size());
    if (n < 2 || n >= c.context_length) {
      fail("a calibration prompt has {} tokens; it needs 2 to {}", n, c.context_length - 1);
    }
    auto single = model::KvCache::for_one_sequence(model.backend(), c, n);
    model::Batch batch;
    batch.begin_sequence(single.block_table);
    for (int32_t i = 0; i < n; ++i) batch.add(prompt[static_cast<size_t>(i)], i, i + 1 == n);
    model.forward(batch, single.cache, scratch, logits);
    const int32_t rows = std::min(config.observation_rows, n);
    std::vector<int32_t> positions(static_cast<size_t>(rows));
    for (int32_t i = 0; i < rows; ++i) positions[static_cast<size_t>(i)] = n - rows + i;
    model.observe(std::span<const int32_t>(prompt).subspan(static_cast<size_t>(n - rows)),
                  positions, {.block_table = single.block_table}, single.cache, scratch, scores);
    for (int64_t cell = 0; cell < num_cells; ++cell) {
      sums[static_cast<size_t>(cell)] += sparsity::streaming_score(
          std::span<const float>(scores.data() + cell * n, static_cast<size_t>(n)),
          config.num_sinks, config.window);
    }
  }
  sparsity::CalibrationProfile profile{
      .model_name = model_name,
      .model_fingerprint = model.fingerprint(),
      .num_layers = c.num_layers,
      .num_kv_heads = c.num_kv_heads,
      .method = fmt::format(
          "streaming_score: attention mass of the last {} rows on the first {} and last {} tokens",
          config.observation_rows, config.num_sinks, config.window),
      .num_samples = static_cast<int64_t>(prompts.size())};
  for (double sum : sums)
    profile.streaming_scores.push_back(
        std::clamp(sum / static_cast<double>(prompts.size()), 0.0, 1.0));
  sparsity::validate(profile);
  return profile;
}

}  // namespace sieve::eval
