#include "kernels/attention.h"

#include <algorithm>

#include "kernels/ops.h"

namespace sieve::kernels {

void attend_head(const HeadAttention& a, float* scores, float* out) {
  for (int64_t t = 0; t < a.num_ctx; ++t) {
    scores[t] = a.scale * dot(a.q, a.k + t * a.row_stride, a.head_dim);
  }
  softmax(scores, a.num_ctx);
  std::fill(out, out + a.head_dim, 0.0f);
  for (int64_t t = 0; t < a.num_ctx; ++t) axpy(scores[t], a.v + t * a.row_stride, out, a.head_dim);
}

}  // namespace sieve::kernels
