#pragma once
// Speed measurements for `sieve bench`: the machine's memory read bandwidth and a model's
// prompt-processing and decode throughput, so decode can be reported as a fraction of the
// bandwidth it could use (decode of a large model is bound by reading every weight once per token).
#include <cstdint>

#include "model/llama.h"

namespace sieve {
class ThreadPool;
}

namespace sieve::eval {

struct BandwidthResult {
  uint64_t bytes = 0;
  int repetitions = 0;
  double best_gb_per_s = 0.0;  // 1 GB = 1e9 bytes
  double mean_gb_per_s = 0.0;
};
// STREAM-style "sum": every thread sums its share of one buffer of `bytes`; best of N passes.
BandwidthResult measure_read_bandwidth(ThreadPool& pool, uint64_t bytes, int repetitions);

struct ModelSpeed {
  int64_t prompt_tokens = 0;
  double prompt_tokens_per_s = 0.0;
  int64_t decode_tokens = 0;
  double decode_tokens_per_s = 0.0;
  uint64_t bytes_per_token = 0;  // weights read per decoded token
  double decode_gb_per_s = 0.0;  // bytes_per_token * decode_tokens_per_s / 1e9
  // Weights every prompt token is multiplied by: q, k, v, o, gate, up, down of every layer.
  // Not counted: the embedding table (a row lookup), the output matrix (prefill applies it to
  // the last prompt token only) and attention's q·k / p·v products (they grow with position).
  uint64_t matmul_params_per_token = 0;
  double prompt_gflop_per_s =
      0.0;  // 2 * matmul_params_per_token * prompt_tokens / prompt time / 1e9
};
// Parameters of the matrices each token passes through in every layer (see ModelSpeed).
uint64_t layer_matmul_params(const model::Weights& weights);
// One prompt of `prompt_tokens` tokens in a single batch, then `decode_tokens` single-token
// steps (greedy). Prompt ids are drawn deterministically from the vocabulary.
ModelSpeed measure_model_speed(const model::LlamaModel& model, int64_t prompt_tokens,
                               int64_t decode_tokens);

}  // namespace sieve::eval
