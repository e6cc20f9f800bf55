#pragma once
// The Llama-family decoder forward pass over a ragged batch (llama, mistral, qwen2, qwen3, phi3:
// model/architecture.h; the differences are data in LayerWeights, not branches on the name).
//
//   tokens ─ embed ─┬─ for each layer ──────────────────────────────────────────────┐
//                   │  q, k, v = Wq·n, Wk·n, Wv·n (+ biases), n = norm(x)           │
//                   │            (or one fused Wqkv·n, split)                       │
//                   │  q, k = rope(headnorm(q)), rope(headnorm(k))  (headnorm: qwen3)│
//                   │  q, k = s·q, (k - μ)/s   (q8 / q4 KV only: key_smoothing.h)   │
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
#include <map>
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
#include "model/key_smoothing.h"
#include "model/model.h"
#include "model/kv_cache.h"
#include "model/weights.h"

namespace sieve::model {

class LlamaModel final : public Model {
 public:
  // Prepares every weight matrix on `backend` (kernels::Backend::prepare_weights: on CPU a
  // repacking of the quantized types, on a device a copy in its memory) and copies norms and biases
  // into its memory. The model holds `backend` (shared) as long as it lives: the prepared weights
  // are its memory.
  LlamaModel(ModelConfig config, Weights weights, std::shared_ptr<kernels::Backend> backend);

  // Model (model.h says what each does).
  const ModelConfig& config() const override { return config_; }
  kernels::Backend& backend() const override { return *backend_; }
  std::shared_ptr<kernels::Backend> shared_backend() const override { return backend_; }
  const Weights& weights() const override { return weights_; }
  std::string fingerprint() const override;
  void prepare_cache(KvCache& cache) const override;
  std::vector<int32_t> precise_kv_streams(kernels::DType dtype) const override;
  void forward(const Batch& batch, KvCache& cache, ForwardScratch& scratch,
               std::vector<float>& logits,
               std::vector<StreamOutputs>* stream_outputs = nullptr) const override;
  void observe(std::span<const TokenId> window_tokens, std::span<const int32_t> window_positions,
               const SequenceKv& kv, const KvCache& cache, ForwardScratch& scratch,
               std::vector<float>& scores) const override;
  void read_keys(const SequenceKv& kv, int32_t num_positions, const KvCache& cache,
                 ForwardScratch& scratch, std::vector<float>& keys) const override;

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
  // The key transform of q8 / q4 caches of `dtype`: measured on first call from one forward
  // pass over an f32 cache (llama.cc), then the same object.
  std::shared_ptr<const KeySmoothing> key_smoothing(kernels::DType dtype) const;
  std::shared_ptr<const KeySmoothing> measure_key_smoothing(kernels::DType dtype) const;

  // Grows the scratch buffers every layer uses for n rows.
  void reserve(kernels::Backend& backend, int64_t n, ForwardScratch& s) const;
  // s.norm ([n][dim]) -> s.q [n][q_dim] and, with_kv, s.k, s.v [n][kv_dim]: the projection (one
  // matmul over a fused QKV matrix, split after), biases, per-head Q/K RMSNorm, RoPE at positions,
  // then, with `smoothing` (a q8 / q4 cache's; null: none), layer `layer`'s key smoothing and
  // the Walsh–Hadamard rotation of Q and K (llama.cc).
  void project_qkv(kernels::Backend& backend, const DeviceLayer& w, int64_t layer, int64_t n,
                   const int32_t* positions, bool with_kv, const KeySmoothing* smoothing,
                   ForwardScratch& s) const;
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
  // attend_and_score(layer) where the rows' attention output (s.attn) is due; `smoothing`: the
  // queries are smoothed and rotated as project_qkv says (the cache's keys are).
  void observe_rows(std::span<const TokenId> window_tokens,
                    std::span<const int32_t> window_positions, const KeySmoothing* smoothing,
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
  kernels::DeviceBuffer vectors_;  // every layer's norms and biases, and output_norm
  // key_smoothing()'s: measured when first asked for (a memo; the model is otherwise unchanged).
  mutable std::mutex smoothing_mutex_;
  mutable std::map<kernels::DType, std::shared_ptr<const KeySmoothing>> smoothings_;
  std::vector<DeviceLayer> layers_;
  kernels::MatrixView token_embd_, output_;
  const float* output_norm_ = nullptr;
};

}  // namespace sieve::model
