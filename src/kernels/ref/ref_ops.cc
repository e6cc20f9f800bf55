// Scalar references: plain loops in double precision, the definition of correct. Each SIMD
// kernel in cpu/ is tested against these on every target. Slow by design.
#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/blocks.h"
#include "kernels/ops.h"
#include "kernels/quant_super_blocks.h"
#include "kernels/ref/ref_small_blocks.h"

namespace sieve::kernels::ref {

namespace {

// y[i][r] for quantized weights, with ggml's semantics: x is quantized to Q8_0 blocks as ggml's
// x86 backend does (quantize_activations_q8), each block contributes
// d_w * d_x * sum_j(q_w[j] * q_x[j]) with an exact integer sum.
void matmul_quantized(const MatrixView& w, const float* x, int64_t num_x, float* y) {
  const int64_t num_blocks = w.cols / kQBlock;
  const size_t w_row_bytes = row_bytes(w.dtype, w.cols);
  std::vector<int8_t> xq(static_cast<size_t>(w.cols));
  std::vector<float> xd(static_cast<size_t>(num_blocks));
  std::vector<int> wq(kQBlock);
  for (int64_t i = 0; i < num_x; ++i) {
    quantize_activations_q8(x + i * w.cols, w.cols, xq.data(), xd.data(), nullptr);
    for (int64_t r = 0; r < w.rows; ++r) {
      const auto* row = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w_row_bytes;
      double sum = 0.0;
      for (int64_t b = 0; b < num_blocks; ++b) {
        float d_w;
        if (w.dtype == DType::kQ8_0) {
          const auto& block = reinterpret_cast<const BlockQ8_0*>(row)[b];
          d_w = f16_to_f32(block.d);
          for (int j = 0; j < kQBlock; ++j) wq[j] = block.qs[j];
        } else {
          const auto& block = reinterpret_cast<const BlockQ4_0*>(row)[b];
          d_w = f16_to_f32(block.d);
          for (int j = 0; j < kQBlock / 2; ++j) {
            wq[j] = (block.qs[j] & 0xF) - 8;
            wq[j + 16] = (block.qs[j] >> 4) - 8;
          }
        }
        int32_t sum_q = 0;
        for (int j = 0; j < kQBlock; ++j) sum_q += wq[j] * xq[b * kQBlock + j];
        sum += static_cast<double>(d_w) * xd[b] * sum_q;
      }
      y[i * w.rows + r] = static_cast<float>(sum);
    }
  }
}

}  // namespace

void matmul(const MatrixView& w, const float* x, int64_t num_x, float* y) {
  if (block_elems(w.dtype) == kQKBlock) return matmul_super_block(w, x, num_x, y);
  if (is_small_block(w.dtype)) return matmul_small_block(w, x, num_x, y);
  if (w.dtype == DType::kQ8_0 || w.dtype == DType::kQ4_0) {
    matmul_quantized(w, x, num_x, y);
    return;
  }
  const size_t w_row_bytes = row_bytes(w.dtype, w.cols);
  std::vector<float> row_f32(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    dequantize_row(w.dtype,
                   static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w_row_bytes,
                   row_f32.data(), w.cols);
    for (int64_t i = 0; i < num_x; ++i) {
      double sum = 0.0;
      for (int64_t c = 0; c < w.cols; ++c)
        sum += static_cast<double>(row_f32[c]) * x[i * w.cols + c];
      y[i * w.rows + r] = static_cast<float>(sum);
    }
  }
}

float dot(const float* a, const float* b, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(sum);
}

void axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void rmsnorm(const float* x, const float* weight, float eps, float* out, int64_t n) {
  // ggml's rms_norm: f32 squares summed in double, mean and scale in f32.
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sum_sq += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum_sq / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

void silu_mul(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    gate[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

float softmax(float* x, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = std::max(max, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - max);
  for (int64_t i = 0; i < n; ++i)
    x[i] = static_cast<float>(std::exp(static_cast<double>(x[i]) - max) / sum);
  return max;
}

// The definition: y[i] = sum_j (-1)^popcount(i & j) x[j] / sqrt(head_dim), O(head_dim^2).
void rotate_heads(float* x, int64_t num_rows, int64_t num_heads, int64_t head_dim) {
  assert(head_dim > 0 && (head_dim & (head_dim - 1)) == 0);
  std::vector<double> y(static_cast<size_t>(head_dim));
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  for (int64_t h = 0; h < num_rows * num_heads; ++h) {
    float* head = x + h * head_dim;
    for (int64_t i = 0; i < head_dim; ++i) {
      double sum = 0.0;
      for (int64_t j = 0; j < head_dim; ++j) {
        const bool odd = std::popcount(static_cast<uint64_t>(i & j)) % 2 != 0;
        sum += odd ? -double{head[j]} : double{head[j]};
      }
      y[static_cast<size_t>(i)] = sum * scale;
    }
    for (int64_t i = 0; i < head_dim; ++i) head[i] = static_cast<float>(y[static_cast<size_t>(i)]);
  }
}

}  // namespace sieve::kernels::ref
