#pragma once
// The Llama-family decoder forward pass over a ragged batch (llama, mistral, qwen2, qwen3, phi3:
// model/architecture.h; the differences are data in LayerWeights, not branches on the name).
//
//   tokens ─ embed ─┬─ for each layer ──────────────────────────────────────────────┐
//                   │  q, k, v = Wq·n, Wk·n, Wv·n (+ biases), n = norm(x)           │
//                   │            (or one fused Wqkv·n, split)                       │
//                   │  q, k = rope(headnorm(q)), rope(headnorm(k))  (headnorm: qwen3)│
//                   │  q, k = s·q, (k - μ)/s   (q8 / q4 KV only: smoothing, llama.cc)│
//                   │  q, k = H·q, H·k  (q8 / q4 KV only: Walsh–Hadamard, llama.cc) │
//                   │  h = x + Wo · attention(q, k, v)                              │
//                   │  x = h + Wdown · (silu(Wgate·norm(h)) * Wup·norm(h))          │
//                   │            (or one fused [Wgate; Wup]·norm(h), split)         │
//                   └───────────────────────────────────────────────────────────────┘
//   logits = Wout · norm(x)      (only for tokens that asked for logits)
//
// Every matrix is applied to all batch tokens at once (one pass over the weights per step).
//
// Every op runs on a kernels::Backend (kernels/backend.h): the weights are prepared on one at
// construction, activations live in ForwardScratch's buffers and K/V in the KvCache, both in
// that backend's memory. The host only builds integer tables (positions, KV row offsets, slice
// lists, Quest's choice) and reads what the backend hands back through download(): logits,
// Quest's slice bounds, attention weights and observation scores.
#include <algorithm>
#include <climits>
#include <optional>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/rope.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/weights.h"

namespace sieve::model {

// Quest's page choice for one stream (host memory).
struct SliceScratch {
  std::vector<float> slice_bounds;
  std::vector<int32_t> slice_ids, chosen, read_slices;
};

// Buffers reused across forward calls, grown on demand; one per caller thread, used with one
// backend (its buffers are that backend's memory). n: the batch's tokens.
struct ForwardScratch {
  // Backend memory.
  kernels::DeviceBuffer x, norm, attn;  // [n][dim], [n][dim], [n][q_dim]
  kernels::DeviceBuffer q, k, v;        // [n][q_dim], [n][kv_dim], [n][kv_dim]
  kernels::DeviceBuffer gate, up;       // [n][ffn_dim] each
  kernels::DeviceBuffer fused;          // a fused projection's output rows before they are split
  // Streams of their own: the query heads of each KV head's group gathered, and their outputs
  // before they go back to attn: [n][q_dim], a sequence's rows at its first token's row, KV
  // head g's [num_tokens][group][head_dim] block after g's of the heads before it.
  kernels::DeviceBuffer q_group, out_group;
  kernels::DeviceBuffer lse;           // [n][num_heads]: attention's log-sum-exp, where needed
  kernels::DeviceBuffer bounds;        // Quest: each choosing stream's slice bounds, one layer
  kernels::DeviceBuffer weights;       // attention weights asked for, one layer
  kernels::DeviceBuffer scores;        // observe: one layer's observation scores; read_keys' keys
  kernels::DeviceBuffer rows, logits;  // [num_logits][dim], [num_logits][vocab]
  // Host memory.
  std::vector<int32_t> positions;    // [n][num_kv_heads]: stream rows' key positions
  std::vector<int32_t> row_ids;      // gathers: q rows to q_group, out_group to attn, logits
  std::vector<int64_t> kv_offsets;   // [n][num_kv_heads]: where new K/V rows go
  std::vector<float> host_bounds;    // bounds, downloaded
  std::vector<SliceScratch> slices;  // [own-stream sequence][kv head]
  std::vector<kernels::AttentionJob> jobs;
  std::vector<kernels::ObservationOutput> observations;
  // Calibration only (LlamaModel's key smoothing; normally empty): called by forward() after
  // each layer's projection with (layer, n), when s.q and s.k hold the layer's RoPE'd rows.
  std::function<void(int64_t, int64_t)> on_projected;
};

class LlamaModel {
 public:
  // Prepares every weight matrix on `backend` (kernels::Backend::prepare_weights: on CPU a
  // repacking of the quantized types, on a device a copy in its memory) and copies norms and biases
  // into its memory. The model holds `backend` (shared) as long as it lives: the prepared weights
  // are its memory.
  LlamaModel(ModelConfig config, Weights weights, std::shared_ptr<kernels::Backend> backend);

  const ModelConfig& config() const { return config_; }
  // Where the model runs: its weights live in this backend's memory and every op of forward()
  // and observe() runs on it. Whoever runs the model allocates its KvCache here. Not part of
  // the model's constness: running ops is not changing the model.
  kernels::Backend& backend() const { return *backend_; }
  // The same backend, shared: another model loaded to run beside this one (model::LoadOptions).
  std::shared_ptr<kernels::Backend> shared_backend() const { return backend_; }
  // The weights as loaded (host views of the file; not the prepared ones forward() reads).
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
  // cache and scratch are in backend()'s memory.
  // q8 / q4 caches smooth keys with statistics measured from one f32 prefill (llama.cc). The
  // first forward / observe on such a cache measures them (once, thread-safe); an engine calls
  // this when it makes one, so that neither a server on f32 / f16 KV nor a first request pays.
  void ensure_key_smoothing() const;

  void forward(const Batch& batch, KvCache& cache, ForwardScratch& scratch,
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
               const SequenceKv& kv, const KvCache& cache, ForwardScratch& scratch,
               std::vector<float>& scores) const;

  // The keys one sequence's streams hold, as the cache stores them (kernels::Backend::
  // gather_keys), for KV policies that score keys themselves (KeyDiff): per stream
  // [layer * num_kv_heads + kv_head], stream after stream, [num_keys][head_dim] floats each,
  // num_keys = num_positions for streams sharing a block table, else each stream's num_keys.
  void read_keys(const SequenceKv& kv, int32_t num_positions, const KvCache& cache,
                 ForwardScratch& scratch, std::vector<float>& keys) const;

 private:
  // One layer as forward() reads it: matrices prepared on backend_, vectors in its memory.
  struct DeviceLayer {
    kernels::MatrixView wq, wk, wv, wo, w_gate, w_up, w_down;
    std::optional<kernels::MatrixView> wqkv, w_gate_up;
    const float* attn_norm = nullptr;  // [dim]
    const float* ffn_norm = nullptr;   // [dim]
    const float* bq = nullptr;         // [q_dim]; null: no bias (and bk, bv alike)
    const float* bk = nullptr;
    const float* bv = nullptr;
    const float* q_norm = nullptr;  // [head_dim]; null: no per-head norm (and k_norm alike)
    const float* k_norm = nullptr;
    // q8 / q4 caches: the key smoothing (llama.cc), k <- (k + key_shift) * key_scale and
    // q <- q * query_scale before the rotation. [kv_dim], [kv_dim], [q_dim]; null: none.
    const float* key_shift = nullptr;
    const float* key_scale = nullptr;
    const float* query_scale = nullptr;
  };
  // One sequence's rows of a layer's attention.
  struct SequenceRows {
    const SequenceKv* kv = nullptr;
    int32_t first_token = 0;  // row of x, q, attn
    int32_t num_tokens = 0;
    const int32_t* positions = nullptr;  // [num_tokens]
    StreamOutputs* out = nullptr;        // may be null without want_attention or choosing
  };

  void check_batch(const Batch& batch, const KvCache& cache) const;
  // The attention's sliding window, in keys (config's sliding_window).
  std::optional<int32_t> window() const {
    if (!config_.sliding_window) return std::nullopt;
    return static_cast<int32_t>(std::min<int64_t>(*config_.sliding_window, INT32_MAX));
  }
  // Measures the key smoothing from one forward pass over an f32 cache (llama.cc) and sets each
  // layer's key_shift, key_scale and query_scale (in smoothing_).
  void measure_key_smoothing();

  // Grows the scratch buffers every layer uses for n rows.
  void reserve(kernels::Backend& backend, int64_t n, ForwardScratch& s) const;
  // s.norm ([n][dim]) -> s.q [n][q_dim] and, with_kv, s.k, s.v [n][kv_dim]: the projection (one
  // matmul over a fused QKV matrix, split after), biases, per-head Q/K RMSNorm, RoPE at positions,
  // then, with `rotate` (a q8 / q4 cache), the Walsh–Hadamard rotation of Q and K (llama.cc).
  void project_qkv(kernels::Backend& backend, const DeviceLayer& w, int64_t n,
                   const int32_t* positions, bool with_kv, bool rotate, ForwardScratch& s) const;
  // After the attention (s.attn): x += Wo·attn, then the FFN on norm(x) (SwiGLU; gate and up
  // from one fused matrix or two).
  void finish_layer(kernels::Backend& backend, const DeviceLayer& w, int64_t n,
                    ForwardScratch& s) const;
  // The sequences' rows (s.q) attend over layer `layer` of their streams into s.attn, all in one
  // paged_attention_batch(). scores (backend memory, may be null; one sequence): each of the
  // layer's streams' observation scores over all rows, one stream after the other.
  void attend(kernels::Backend& backend, std::span<const SequenceRows> sequences, int64_t layer,
              const KvCache& cache, ForwardScratch& s, float* scores = nullptr) const;
  // The observation passes' shared part: embeds the window rows and runs every layer, calling
  // attend_and_score(layer) where the rows' attention output (s.attn) is due; `rotate`: the
  // queries are rotated as project_qkv says (the cache's keys are).
  void observe_rows(std::span<const TokenId> window_tokens,
                    std::span<const int32_t> window_positions, bool rotate,
                    kernels::Backend& backend, ForwardScratch& s,
                    const std::function<void(int64_t layer)>& attend_and_score) const;
  // Quest: the slices one decode row of `stream` reads, from its slices' bounds (host; choosing
  // selections) or its earlier choice.
  std::span<const int32_t> select_slices(const KvStream& stream, std::span<const float> bounds,
                                         SliceScratch& s) const;

  ModelConfig config_;
  Weights weights_;
  kernels::RopeParams rope_;
  // Declared before what lives in its memory, so that it goes last.
  std::shared_ptr<kernels::Backend> backend_;
  kernels::DeviceBuffer vectors_;    // every layer's norms and biases, and output_norm
  kernels::DeviceBuffer smoothing_;  // every layer's key_shift, key_scale, query_scale
  mutable std::once_flag smoothing_measured_;
  std::vector<DeviceLayer> layers_;
  kernels::MatrixView token_embd_, output_;
  const float* output_norm_ = nullptr;
};

}  // namespace sieve::model
