#pragma once
// Scaled dot-product attention of one query head over a run of cached key/value rows.
// Cost: 2 * num_ctx * head_dim multiply-adds; memory: num_ctx floats of scratch.
#include <cstdint>

namespace sieve::kernels {

struct HeadAttention {
  const float* q = nullptr;  // [head_dim]
  const float* k = nullptr;  // key t at k + t * row_stride, t < num_ctx
  const float* v = nullptr;  // value t at v + t * row_stride
  int64_t row_stride = 0;    // floats between consecutive positions
  int64_t num_ctx = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;        // usually 1/sqrt(head_dim)
};

// out[head_dim] = softmax(scale * q·k_t) · v_t over t < num_ctx; `scores` is num_ctx floats of
// scratch (left holding the probabilities).
void attend_head(const HeadAttention& a, float* scores, float* out);

}  // namespace sieve::kernels
