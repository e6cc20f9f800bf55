#pragma once
// A model as the code that runs one sees it: the engine, the speculative drafts, the evaluation
// tools and the CLI hold a `Model` and never name a family. LlamaModel (llama.h) is the Llama
// family's (llama, mistral, qwen2, qwen3, phi3: one layer shape, their differences data in
// LayerWeights). A family of another shape (Gemma's post-norms, a mixture of experts' FFN) is
// another class beside it implementing this interface, made by model::load_model (loader.cc) from
// the file's architecture (architecture.h).
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/paged_attention.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/weights.h"

namespace sieve::model {

// Quest's page choice for one stream (host memory).
struct SliceScratch {
  std::vector<float> slice_bounds;
  std::vector<int32_t> slice_ids, chosen, read_slices, read_areas;
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
  kernels::DeviceBuffer bound_q;       // Quest: a rotated stream's queries rotated back
  kernels::DeviceBuffer weights;       // attention weights asked for, one layer
  kernels::DeviceBuffer scores;        // observe: one layer's observation scores; read_keys' keys
  kernels::DeviceBuffer rows, logits;  // [num_logits][dim], [num_logits][vocab]
  // Host memory.
  std::vector<int32_t> positions;        // [n][num_kv_heads]: stream rows' key positions
  std::vector<int32_t> row_ids;          // gathers: q rows to q_group, out_group to attn, logits
  std::vector<int64_t> kv_offsets;       // [n][num_kv_heads]: where new K/V rows go
  std::vector<int64_t> precise_offsets;  // one sequence's rows of one precise stream: f16 copy
  std::vector<float> host_bounds;        // bounds, downloaded
  std::vector<SliceScratch> slices;      // [own-stream sequence][kv head]
  std::vector<kernels::AttentionJob> jobs;
  std::vector<kernels::ObservationOutput> observations;
  // Calibration only (LlamaModel's key smoothing; normally empty): called by forward() after
  // each layer's projection with (layer, n), when s.q and s.k hold the layer's RoPE'd rows.
  std::function<void(int64_t, int64_t)> on_projected;
};

class Model {
 public:
  virtual ~Model() = default;

  virtual const ModelConfig& config() const = 0;
  // Where the model runs: its weights live in this backend's memory and every op of forward()
  // and observe() runs on it. Whoever runs the model allocates its KvCache here. Not part of
  // the model's constness: running ops is not changing the model.
  virtual kernels::Backend& backend() const = 0;
  // The same backend, shared: another model loaded to run beside this one (model::LoadOptions).
  virtual std::shared_ptr<kernels::Backend> shared_backend() const = 0;
  // The weights as loaded (host views of the file; not the prepared ones forward() reads).
  virtual const Weights& weights() const = 0;
  // Identifies the weights (calibration profiles record it; the engine checks it before use):
  // 16 hex digits of a 64-bit FNV-1a hash over the configuration and, for every matrix and norm,
  // its type, shape and up to 4 KiB at each end. Deterministic; reads ~100 KiB, not the model.
  virtual std::string fingerprint() const = 0;

  // Readies `cache` for this model: a q8 / q4 cache gets the key smoothing its keys are stored
  // with (key_smoothing.h), measured from one f32 prefill the first time the model needs it
  // (once, thread-safe). forward() does it on first use; an engine calls it when it makes its
  // cache, so that neither a server on f32 / f16 KV nor a first request pays.
  virtual void prepare_cache(KvCache& cache) const = 0;
  // The streams (layer * num_kv_heads + kv head, ascending) a q8 / q4 cache of `dtype` should
  // also keep in f16 (KvCache's precise streams): the heads whose keys that dtype rounds at far
  // more cost than the others' (KeySmoothing::precise_streams), measured with the smoothing.
  // Empty for f32 / f16. A cache gets them at construction, so the engine asks before it sizes
  // its pool.
  virtual std::vector<int32_t> precise_kv_streams(kernels::DType dtype) const = 0;

  // Runs `batch`, writing each token's K/V into `cache` through its sequence's block table;
  // each token attends to positions [0, position] of its sequence. Fills `logits` with
  // [batch.num_logits()][vocab] rows, in batch order of the tokens that asked for them. Throws
  // sieve::Error for tokens outside the vocabulary, pages outside the cache or positions
  // outside the block table.
  // stream_outputs (may be null): [batch sequence] what the streams' rows hand back (attention
  // weights, Quest choices).
  // cache and scratch are in backend()'s memory.
  virtual void forward(const Batch& batch, KvCache& cache, ForwardScratch& scratch,
                       std::vector<float>& logits,
                       std::vector<StreamOutputs>* stream_outputs = nullptr) const = 0;

  // KV sparsity's observation pass (SnapKV): how much attention every cached key of one
  // sequence receives from the query rows of `window_tokens` at `window_positions` (its last
  // tokens, already in the cache). Recomputes those rows through every layer (their K/V are not
  // written again) and, per layer, sums the attention probabilities over the rows and over each
  // KV head's query heads, from the flash kernel's LSE (kernels::observation_scores).
  // scores: per stream [layer * num_kv_heads + kv_head], stream after stream, one per key:
  // num_keys = last window position + 1 for streams sharing a block table, else each stream's
  // num_keys (its kept keys, with their causal visibility as in forward). The result depends
  // only on the window and the cache, not on how the prompt was chunked.
  virtual void observe(std::span<const TokenId> window_tokens,
                       std::span<const int32_t> window_positions, const SequenceKv& kv,
                       const KvCache& cache, ForwardScratch& scratch,
                       std::vector<float>& scores) const = 0;

  // The keys one sequence's streams hold, as the cache stores them (kernels::Backend::
  // gather_keys), for KV policies that score keys themselves (KeyDiff): per stream
  // [layer * num_kv_heads + kv_head], stream after stream, [num_keys][head_dim] floats each,
  // num_keys = num_positions for streams sharing a block table, else each stream's num_keys.
  virtual void read_keys(const SequenceKv& kv, int32_t num_positions, const KvCache& cache,
                         ForwardScratch& scratch, std::vector<float>& keys) const = 0;
};

}  // namespace sieve::model
