#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

namespace sieve::kernels {

namespace {

// The pair index at which a pair of frequency base^(-2i/num_dims) turns num_turns times over
// context positions: solving context * base^(-2i/n) = 2 pi num_turns for i.
float yarn_corr_dim(int64_t num_dims, int64_t context, float num_turns, float base) {
  return static_cast<float>(num_dims) *
         std::log(static_cast<float>(context) / (num_turns * 2.0f * std::numbers::pi_v<float>)) /
         (2.0f * std::log(base));
}

}  // namespace

void rope_yarn_corr_dims(const RopeParams& params, float dims[2]) {
  const float low = std::floor(yarn_corr_dim(params.num_dims, params.yarn.original_context,
                                             params.yarn.beta_fast, params.freq_base));
  const float high = std::ceil(yarn_corr_dim(params.num_dims, params.yarn.original_context,
                                             params.yarn.beta_slow, params.freq_base));
  dims[0] = std::max(0.0f, low);
  dims[1] = std::min(static_cast<float>(params.num_dims - 1), high);
}

void rope(const RopeParams& params, int64_t position, float* x, int64_t num_heads) {
  const int64_t num_pairs = params.num_dims / 2;
  // Small, per-call: num_pairs is at most head_dim/2 (typically 64).
  float cos_theta[512];
  float sin_theta[512];
  std::vector<float> heap_cos, heap_sin;
  float* cos_ptr = cos_theta;
  float* sin_ptr = sin_theta;
  if (num_pairs > 512) {
    heap_cos.resize(num_pairs);
    heap_sin.resize(num_pairs);
    cos_ptr = heap_cos.data();
    sin_ptr = heap_sin.data();
  }
  const float ext_factor = params.yarn.ext_factor;
  float corr_dims[2] = {0.0f, 0.0f};
  float mscale = params.attn_factor;
  if (ext_factor != 0.0f) {
    rope_yarn_corr_dims(params, corr_dims);
    mscale *= 1.0f + 0.1f * std::log(1.0f / params.freq_scale);
  }
  // As ggml: theta starts at the position and is multiplied by base^(-2/n) per pair, in float.
  const float theta_scale = std::pow(params.freq_base, -2.0f / static_cast<float>(params.num_dims));
  float theta_base = static_cast<float>(position);
  for (int64_t i = 0; i < num_pairs; ++i, theta_base *= theta_scale) {
    const float theta_extrap =
        params.freq_factors.empty() ? theta_base : theta_base / params.freq_factors[i];
    const float theta_interp = params.freq_scale * theta_extrap;
    float theta = theta_interp;
    if (ext_factor != 0.0f) {
      const float ramp_y =
          (static_cast<float>(i) - corr_dims[0]) / std::max(0.001f, corr_dims[1] - corr_dims[0]);
      const float ramp_mix = (1.0f - std::clamp(ramp_y, 0.0f, 1.0f)) * ext_factor;
      theta = theta_interp * (1.0f - ramp_mix) + theta_extrap * ramp_mix;
    }
    cos_ptr[i] = std::cos(theta) * mscale;
    sin_ptr[i] = std::sin(theta) * mscale;
  }
  const bool neox = params.ordering == RopeOrdering::kNeox;
  for (int64_t h = 0; h < num_heads; ++h) {
    float* head = x + h * params.head_dim;
    for (int64_t i = 0; i < num_pairs; ++i) {
      float* a = neox ? head + i : head + 2 * i;
      float* b = neox ? head + i + num_pairs : head + 2 * i + 1;
      const float x0 = *a, x1 = *b;
      *a = x0 * cos_ptr[i] - x1 * sin_ptr[i];
      *b = x0 * sin_ptr[i] + x1 * cos_ptr[i];
    }
  }
}

}  // namespace sieve::kernels
