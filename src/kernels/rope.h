#pragma once
// Rotary position embedding, applied in place to the heads of one token.
#include <cstdint>
#include <span>

namespace sieve::kernels {

enum class RopeOrdering : uint8_t {
  kNormal,  // pairs (2i, 2i+1)
  kNeox,    // pairs (i, i + num_dims/2)
};

struct RopeParams {
  RopeOrdering ordering = RopeOrdering::kNormal;
  int64_t head_dim = 0;
  int64_t num_dims = 0;  // rotated dims per head (even, <= head_dim); the rest pass through
  // theta_i = position * freq_scale * freq_base^(-2i/num_dims) / freq_factors[i]
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  std::span<const float> freq_factors;  // num_dims/2 entries, or empty
};

// Rotates num_heads consecutive heads of `x` ([num_heads][head_dim]) for `position`.
// Angles are computed in float as ggml does, once per call, then applied to every head.
void rope(const RopeParams& params, int64_t position, float* x, int64_t num_heads);

}  // namespace sieve::kernels
