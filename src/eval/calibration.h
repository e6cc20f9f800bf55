#pragma once
// `sieve calibrate`: how streaming-like each (layer, KV head) of a model is, measured on sample
// prompts, as the calibration profile lserve and heads:...@profile=F read (sparsity/calibration.h).
//
// Per prompt: one dense forward pass over the prompt, then the observation scores of its last
// `observation_rows` rows (Model::observe: attention mass per key, summed over the rows and
// the KV head's query heads), then sparsity::streaming_score() = the share of that mass on the
// first `num_sinks` and the last `window` tokens. A head's score is the mean over the prompts.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"
#include "sparsity/calibration.h"

namespace sieve::eval {

struct CalibrationConfig {
  int64_t num_sinks = 4;
  int64_t window = 64;
  int32_t observation_rows = 16;
};

// prompts: token ids, each at least 2 tokens and shorter than the context. Throws sieve::Error.
sparsity::CalibrationProfile calibrate(const model::Model& model, const std::string& model_name,
                                       std::span<const std::vector<int32_t>> prompts,
                                       const CalibrationConfig& config);

}  // namespace sieve::eval
