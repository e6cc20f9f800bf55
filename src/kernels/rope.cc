#include "kernels/rope.h"

#include <cmath>
#include <vector>

namespace sieve::kernels {

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
  for (int64_t i = 0; i < num_pairs; ++i) {
    // Same formula as ggml: theta = p * base^(-2i/n), in float; then cos/sin.
    const float inv_freq =
        std::pow(params.freq_base, -2.0f * static_cast<float>(i) / static_cast<float>(params.num_dims));
    float theta = static_cast<float>(position) * params.freq_scale * inv_freq;
    if (!params.freq_factors.empty()) theta /= params.freq_factors[i];
    cos_ptr[i] = std::cos(theta);
    sin_ptr[i] = std::sin(theta);
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
