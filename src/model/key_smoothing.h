#pragma once
// The key smoothing of a q8 / q4 KV cache (llama.cc says what it is and why): per layer,
// key_shift and key_scale [kv_dim] applied to keys before they are stored, query_scale [q_dim]
// to the queries that read them, in a backend's memory. A quantized cache carries the smoothing
// its keys were written with (KvCache::key_smoothing), so every pass that reads those keys
// scales its queries alike; the model measures it once and shares it between its caches.
#include <cstdint>
#include <span>

#include "kernels/backend.h"

namespace sieve::model {

class KeySmoothing {
 public:
  // host: per layer [key_shift | key_scale | query_scale], copied into `backend`'s memory.
  KeySmoothing(kernels::Backend& backend, int64_t num_layers, int64_t kv_dim, int64_t q_dim,
               std::span<const float> host);

  const float* key_shift(int64_t layer) const { return layer_start(layer); }
  const float* key_scale(int64_t layer) const { return layer_start(layer) + kv_dim_; }
  const float* query_scale(int64_t layer) const { return layer_start(layer) + 2 * kv_dim_; }

 private:
  const float* layer_start(int64_t layer) const {
    return buffer_.as<const float>() + layer * (2 * kv_dim_ + q_dim_);
  }

  int64_t kv_dim_, q_dim_;
  kernels::DeviceBuffer buffer_;
};

}  // namespace sieve::model
