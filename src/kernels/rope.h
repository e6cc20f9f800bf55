#pragma once
// Rotary position embedding, applied in place to the heads of one token.
#include <cstdint>
#include <span>

namespace sieve::kernels {

enum class RopeOrdering : uint8_t {
  kNormal,  // pairs (2i, 2i+1)
  kNeox,    // pairs (i, i + num_dims/2)
};

// YaRN (arXiv 2309.00071) as ggml's rope computes it. Pair i's angle blends the interpolated
// angle (freq_scale * theta) and the original one (theta) by ramp(i) * ext_factor, where ramp
// is 1 below the low correction dim and 0 above the high one (linear between); the correction
// dims are where a pair turns beta_fast (low) and beta_slow (high) times over original_context
// positions. With ext_factor != 0, cos and sin are also multiplied by 1 + 0.1 ln(1/freq_scale).
struct RopeYarn {
  float ext_factor = 0.0f;  // 0: no ramp (plain linear interpolation); YaRN models: 1
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int64_t original_context = 0;  // training context before scaling (n_ctx_orig)
};

struct RopeParams {
  RopeOrdering ordering = RopeOrdering::kNormal;
  int64_t head_dim = 0;
  int64_t num_dims = 0;  // rotated dims per head (even, <= head_dim); the rest pass through
  // theta_i = position * freq_base^(-2i/num_dims) / freq_factors[i], then scaled by freq_scale
  // (blended by YaRN when yarn.ext_factor != 0).
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  std::span<const float> freq_factors;  // num_dims/2 entries, or empty
  float attn_factor = 1.0f;             // magnitude multiplier on cos and sin
  RopeYarn yarn;
};

// YaRN's correction dims [low, high] (pair indices, as floats) for these parameters.
void rope_yarn_corr_dims(const RopeParams& params, float dims[2]);

// Rotates num_heads consecutive heads of `x` ([num_heads][head_dim]) for `position`.
// Angles are computed in float as ggml does, once per call, then applied to every head.
void rope(const RopeParams& params, int64_t position, float* x, int64_t num_heads);

}  // namespace sieve::kernels
