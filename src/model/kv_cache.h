#pragma once
// Contiguous per-sequence K/V storage: one region per slot, holding every position up to
// `capacity`. Layout (floats):
//
//   keys[layer][slot][position][kv_head][head_dim]      (values: same)
//
// This is the single-sequence foundation; the paged pool of the engine replaces it.
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace sieve::model {

class KvCache {
 public:
  KvCache(const ModelConfig& config, int32_t num_slots, int32_t capacity)
      : num_layers_(config.num_layers),
        num_slots_(num_slots),
        capacity_(capacity),
        row_floats_(config.kv_dim()),
        keys_(static_cast<size_t>(num_layers_) * num_slots * capacity * row_floats_),
        values_(keys_.size()) {}

  int32_t num_slots() const { return num_slots_; }
  int32_t capacity() const { return capacity_; }
  int64_t row_floats() const { return row_floats_; }  // floats between consecutive positions

  float* key(int64_t layer, int32_t slot, int32_t position) { return &keys_[offset(layer, slot, position)]; }
  float* value(int64_t layer, int32_t slot, int32_t position) { return &values_[offset(layer, slot, position)]; }

 private:
  size_t offset(int64_t layer, int32_t slot, int32_t position) const {
    return ((static_cast<size_t>(layer) * num_slots_ + slot) * capacity_ + position) * row_floats_;
  }
  int64_t num_layers_;
  int32_t num_slots_;
  int32_t capacity_;
  int64_t row_floats_;
  std::vector<float> keys_;
  std::vector<float> values_;
};

}  // namespace sieve::model
