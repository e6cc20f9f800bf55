#pragma once
// The Llama decoder forward pass over a ragged batch.
//
//   tokens ─ embed ─┬─ for each layer ──────────────────────────────────────────────┐
//                   │  h = x + Wo · attention(rope(Wq·norm(x)), rope(Wk·norm(x)), Wv·norm(x))
//                   │  x = h + Wdown · (silu(Wgate·norm(h)) * Wup·norm(h))          │
//                   └───────────────────────────────────────────────────────────────┘
//   logits = Wout · norm(x)      (only for tokens that asked for logits)
//
// Every matrix is applied to all batch tokens at once (one pass over the weights per step).
#include <memory>
#include <vector>

#include "kernels/rope.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/weights.h"

namespace sieve {
class ThreadPool;
}

namespace sieve::model {

// Activation buffers reused across forward calls (grown on demand). One per caller thread.
struct ForwardScratch {
  std::vector<float> x, norm, q, k, v, attn, gate, up, rows;
};

class LlamaModel {
 public:
  LlamaModel(ModelConfig config, Weights weights);

  const ModelConfig& config() const { return config_; }
  const Weights& weights() const { return weights_; }

  // Runs `batch`, writing each token's K/V into `cache` through its sequence's block table;
  // each token attends to positions [0, position] of its sequence. Fills `logits` with
  // [batch.num_logits()][vocab] rows, in batch order of the tokens that asked for them. Throws
  // sieve::Error for tokens outside the vocabulary, pages outside the cache or positions
  // outside the block table.
  void forward(const Batch& batch, KvCache& cache, ThreadPool& pool, ForwardScratch& scratch,
               std::vector<float>& logits) const;

 private:
  void check_batch(const Batch& batch, const KvCache& cache) const;

  ModelConfig config_;
  Weights weights_;
  kernels::RopeParams rope_;
};

}  // namespace sieve::model
