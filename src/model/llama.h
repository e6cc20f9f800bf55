#pragma once
// The Llama-family decoder forward pass over a ragged batch (llama, mistral, qwen2, qwen3, phi3:
// model/architecture.h; the differences are data in LayerWeights, not branches on the name).
//
//   tokens ─ embed ─┬─ for each layer ──────────────────────────────────────────────┐
//                   │  q, k, v = Wq·n, Wk·n, Wv·n (+ biases), n = norm(x)           │
//                   │            (or one fused Wqkv·n, split)                       │
//                   │  q, k = rope(headnorm(q)), rope(headnorm(k))  (headnorm: qwen3)│
//                   │  h = x + Wo · attention(q, k, v)                              │
//                   │  x = h + Wdown · (silu(Wgate·norm(h)) * Wup·norm(h))          │
//                   │            (or one fused [Wgate; Wup]·norm(h), split)         │
//                   └───────────────────────────────────────────────────────────────┘
//   logits = Wout · norm(x)      (only for tokens that asked for logits)
//
// Every matrix is applied to all batch tokens at once (one pass over the weights per step).
#include <algorithm>
#include <climits>
#include <exception>
#include <optional>
#include <functional>
#include <memory>
#include <span>
#include <string>
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

// Quest's page choice for one stream.
struct SliceScratch {
  std::vector<float> slice_bounds;
  std::vector<int32_t> slice_ids, chosen, read_slices;
};

// Activation buffers reused across forward calls (grown on demand). One per caller thread.
struct ForwardScratch {
  std::vector<float> x, norm, q, k, v, attn, gate, up, rows;
  std::vector<float> fused;  // a fused projection's output rows before they are split
  std::vector<float> q_group, out_group, lse;  // attend: per KV head, attention weights, LSE
  std::vector<int32_t> positions;
  std::vector<SliceScratch> slices;             // [kv head]
  std::vector<std::exception_ptr> head_errors;  // [kv head], from heads attended on workers
};

class LlamaModel {
 public:
  LlamaModel(ModelConfig config, Weights weights);

  const ModelConfig& config() const { return config_; }
  const Weights& weights() const { return weights_; }
  // Identifies the weights (calibration profiles record it; the engine checks it before use):
  // 16 hex digits of a 64-bit FNV-1a hash over the configuration and, for every matrix and norm,
  // its type, shape and up to 4 KiB at each end. Deterministic; reads ~100 KiB, not the model.
  std::string fingerprint() const;

  // Runs `batch`, writing each token's K/V into `cache` through its sequence's block table;
  // each token attends to positions [0, position] of its sequence. Fills `logits` with
  // [batch.num_logits()][vocab] rows, in batch order of the tokens that asked for them. Throws
  // sieve::Error for tokens outside the vocabulary, pages outside the cache or positions
  // outside the block table.
  // stream_outputs (may be null): [batch sequence] what the streams' rows hand back (attention
  // weights, Quest choices).
  void forward(const Batch& batch, KvCache& cache, ThreadPool& pool, ForwardScratch& scratch,
               std::vector<float>& logits,
               std::vector<StreamOutputs>* stream_outputs = nullptr) const;

  // KV sparsity's observation pass (SnapKV): how much attention every cached key of one
  // sequence receives from the query rows of `window_tokens` at `window_positions` (its last
  // tokens, already in the cache). Recomputes those rows through every layer (their K/V are not
  // written again) and, per layer, sums the attention probabilities over the rows and over each
  // KV head's query heads, from the flash kernel's LSE (kernels::observation_scores).
  // scores: per stream [layer * num_kv_heads + kv_head], stream after stream, one per key:
  // num_keys = last window position + 1 for streams sharing a block table, else each stream's
  // num_keys (its kept keys, with their causal visibility as in forward). The result depends
  // only on the window and the cache, not on how the prompt was chunked.
  void observe(std::span<const TokenId> window_tokens, std::span<const int32_t> window_positions,
               const SequenceKv& kv, const KvCache& cache, ThreadPool& pool,
               ForwardScratch& scratch, std::vector<float>& scores) const;

 private:
  void check_batch(const Batch& batch, const KvCache& cache) const;
  // The attention's sliding window, in keys (config's sliding_window).
  std::optional<int32_t> window() const {
    if (!config_.sliding_window) return std::nullopt;
    return static_cast<int32_t>(std::min<int64_t>(*config_.sliding_window, INT32_MAX));
  }
  void embed(std::span<const TokenId> tokens, ForwardScratch& s) const;  // rows of s.x
  // s.norm ([n][dim]) -> s.q [n][q_dim] and, with_kv, s.k, s.v [n][kv_dim]: the projection (one
  // matmul over a fused QKV matrix, split after), biases, per-head Q/K RMSNorm, RoPE at positions.
  void project_qkv(const LayerWeights& w, int64_t n, const int32_t* positions, bool with_kv,
                   ThreadPool& pool, ForwardScratch& s) const;
  // After the attention (s.attn): x += Wo·attn, then the FFN on norm(x) (SwiGLU; gate and up
  // from one fused matrix or two).
  void finish_layer(const LayerWeights& w, int64_t n, ThreadPool& pool, ForwardScratch& s) const;
  // One sequence's rows (s.q from first_token) attend over layer `layer` of its streams into
  // s.attn. scores (may be null): each of the layer's streams' observation scores over all rows,
  // one stream after the other. out (may be null without want_attention or choosing
  // selections): what the rows hand back.
  void attend(const SequenceKv& kv, int64_t layer, int32_t first_token, int32_t num_tokens,
              const int32_t* positions, const KvCache& cache, ThreadPool& pool, ForwardScratch& s,
              StreamOutputs* out, float* scores = nullptr) const;
  // The observation passes' shared part: embeds the window rows and runs every layer, calling
  // attend_and_score(layer) where the rows' attention output (s.attn) is due.
  void observe_rows(std::span<const TokenId> window_tokens,
                    std::span<const int32_t> window_positions, ThreadPool& pool, ForwardScratch& s,
                    const std::function<void(int64_t layer)>& attend_and_score) const;
  std::span<const int32_t> select_slices(const KvStream& stream, const float* q_group,
                                         int64_t group, int32_t page_size, SliceScratch& s) const;

  ModelConfig config_;
  Weights weights_;
  kernels::RopeParams rope_;
};

}  // namespace sieve::model
