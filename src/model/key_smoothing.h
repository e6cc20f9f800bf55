#pragma once
// The key transform of a q8 / q4 KV cache (llama.cc says what it is and why): per layer,
// key_shift and key_scale [kv_dim] applied to keys before they are stored, query_scale [q_dim]
// to the queries that read them, in a backend's memory, and per kv head whether its keys (and
// its group's queries) are also rotated. A quantized cache carries the transform its keys were
// written with (KvCache::key_smoothing), so every pass that reads those keys transforms its
// queries alike; the model measures one per KV dtype and shares it between its caches.
//
// Each kv head is smoothed and rotated unless plain, smoothed or rotated alone rounds its keys
// at far less cost to the attention on the calibration pass, for the cache's dtype
// (key_smoothing.cc). No one transform suits every head: smoothing and rotation spread a
// channel outlier over its block (copy-lm: q4 top-1 0.70 -> 0.82), but a head whose keys are
// few equal-magnitude codes (eval-32k's wired induction head: scores of ~100 logits) rounds
// them almost exactly as they are at 4 bits (eval-32k, q4 KV, 4k prompts: top-1 0.855 -> 0.942,
// perplexity +22% -> +2.5% against f32).
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace sieve::model {

class KeySmoothing {
 public:
  struct Shape {
    int64_t num_layers, num_heads, num_kv_heads, head_dim;
    int64_t rope_dims;  // the channels RoPE turns, in pairs
    bool rope_neox;     // pairs (i, i + rope_dims / 2), else (2i, 2i + 1)
  };

  // Chooses each layer's transform from a calibration pass (the model's forward over an f32
  // cache), one layer at a time, then make() puts it in a backend's memory.
  class Builder {
   public:
    Builder(const Shape& shape, kernels::DType dtype);
    // n rows of the layer's queries [n][q_dim] and keys [n][kv_dim], after RoPE.
    void measure_layer(int64_t layer, std::span<const float> q, std::span<const float> k,
                       int64_t n);
    // A layer left unmeasured keeps the identity (no shift, unit scales, no rotation).
    std::shared_ptr<const KeySmoothing> make(kernels::Backend& backend) const;

   private:
    // The streams whose smoothed and rotated keys cost far more than the others' (the
    // outliers, key_smoothing.cc), ascending.
    std::vector<int32_t> precise_streams() const;

    Shape shape_;
    kernels::DType dtype_;
    std::vector<float> host_;      // per layer [key_shift | key_scale | query_scale]
    std::vector<uint8_t> rotate_;  // [layer][kv head]
    // [layer][kv head]: the default transform's cost per query on the calibration pass.
    std::vector<double> default_cost_;
  };

  // host: per layer [key_shift | key_scale | query_scale], copied into `backend`'s memory;
  // rotate: [layer][kv head], 1 where the head is rotated; precise_streams: ascending stream
  // indices (layer * num_kv_heads + kv head).
  KeySmoothing(kernels::Backend& backend, const Shape& shape, std::span<const float> host,
               std::vector<uint8_t> rotate, std::vector<int32_t> precise_streams = {});

  const float* key_shift(int64_t layer) const { return layer_start(layer); }
  const float* key_scale(int64_t layer) const { return layer_start(layer) + kv_dim_; }
  const float* query_scale(int64_t layer) const { return layer_start(layer) + 2 * kv_dim_; }
  // The Walsh–Hadamard transform works on powers of two: a head is rotated in groups of the
  // largest one dividing head_dim (a multiple of 32 for q8 / q4: the whole head at 64 or 128,
  // blocks of 32 at 96).
  static int64_t rotation_group(int64_t head_dim) { return head_dim & -head_dim; }
  bool rotates(int64_t layer, int64_t kv_head) const {
    return rotate_[static_cast<size_t>(layer * num_kv_heads_ + kv_head)] != 0;
  }
  // The streams (layer * num_kv_heads + kv head, ascending) whose keys this dtype rounds at
  // far more cost to their attention than the other heads' (no transform helps them enough):
  // a cache may keep them in f16 too (KvCache's precise streams). eval-32k's wired induction
  // head separates matches by fractions of a logit out of ~100; 8 bits per channel move them.
  std::span<const int32_t> precise_streams() const { return precise_streams_; }

 private:
  const float* layer_start(int64_t layer) const {
    return buffer_.as<const float>() + layer * (2 * kv_dim_ + q_dim_);
  }

  int64_t kv_dim_, q_dim_, num_kv_heads_;
  std::vector<uint8_t> rotate_;
  std::vector<int32_t> precise_streams_;
  kernels::DeviceBuffer buffer_;
};

}  // namespace sieve::model
