#pragma once
// The shape of a Llama-family decoder, read from GGUF metadata (`<arch>.*` keys) or from a
// llama2.c checkpoint header. Everything the forward pass needs to know about the model's
// geometry lives here; weights live in Weights.
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/rope.h"

namespace sieve::gguf {
class File;
}

namespace sieve::model {

using kernels::RopeOrdering;  // kNormal: pairs (2i, 2i+1), llama.cpp "normal"; kNeox: (i, i + n/2)

struct RopeConfig {
  RopeOrdering ordering = RopeOrdering::kNormal;
  int64_t num_dims = 0;     // rotated dimensions per head (<= head_dim)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;  // linear scaling: position multiplied by this (1 / scaling.factor)
  // Per-pair frequency divisors (Llama 3 "rope_freqs" tensor); empty = all 1.
  std::vector<float> freq_factors;
};

struct ModelConfig {
  std::string architecture;  // "llama"
  std::string name;
  int64_t dim = 0;           // embedding size
  int64_t num_layers = 0;
  int64_t num_heads = 0;     // query heads
  int64_t num_kv_heads = 0;  // key/value heads (GQA: num_heads % num_kv_heads == 0)
  int64_t head_dim = 0;
  int64_t ffn_dim = 0;
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  float rms_eps = 1e-5f;
  RopeConfig rope;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t group_size() const { return num_heads / num_kv_heads; }

  // Throws sieve::Error if the numbers are inconsistent (zero sizes, heads not dividing, ...).
  void validate() const;
  std::string summary() const;
};

// Reads `general.architecture` and the `<arch>.*` keys. Unknown architectures and missing
// required keys are errors naming the key. The vocabulary size comes from the tokenizer
// tokens array (or `<arch>.vocab_size`).
ModelConfig config_from_gguf(const gguf::File& file);

}  // namespace sieve::model
