// Reference matmul for Q4_1, Q5_0, Q5_1, IQ4_NL: each weight block decoded to integers, a
// scale and a minimum, then exact integer dot products with the Q8_0 activation blocks.
#include "kernels/ref/ref_small_blocks.h"

#include <cstring>
#include <vector>

#include "kernels/blocks.h"

namespace sieve::kernels::ref {

namespace {

// A weight block as w[j] = d * q[j] + m.
struct IntegerBlock {
  int q[kQBlock];
  float d = 0.0f;
  float m = 0.0f;
};

// Quant j of a block of 32: nibble j % 16 of qs (low for j < 16), plus bit j of qh as bit 4.
int nibble(const uint8_t* qs, int j) { return j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4; }
int five_bits(const uint8_t* qs, const uint8_t* qh, int j) {
  uint32_t bits;
  std::memcpy(&bits, qh, sizeof(bits));
  return nibble(qs, j) | static_cast<int>(((bits >> j) & 1u) << 4);
}

IntegerBlock decode(DType dtype, const uint8_t* bytes) {
  IntegerBlock out;
  switch (dtype) {
    case DType::kQ4_1: {
      const auto& block = *reinterpret_cast<const BlockQ4_1*>(bytes);
      out.d = f16_to_f32(block.d);
      out.m = f16_to_f32(block.m);
      for (int j = 0; j < kQBlock; ++j) out.q[j] = nibble(block.qs, j);
      break;
    }
    case DType::kQ5_0: {
      const auto& block = *reinterpret_cast<const BlockQ5_0*>(bytes);
      out.d = f16_to_f32(block.d);
      for (int j = 0; j < kQBlock; ++j) out.q[j] = five_bits(block.qs, block.qh, j) - 16;
      break;
    }
    case DType::kQ5_1: {
      const auto& block = *reinterpret_cast<const BlockQ5_1*>(bytes);
      out.d = f16_to_f32(block.d);
      out.m = f16_to_f32(block.m);
      for (int j = 0; j < kQBlock; ++j) out.q[j] = five_bits(block.qs, block.qh, j);
      break;
    }
    case DType::kIQ4_NL: {
      const auto& block = *reinterpret_cast<const BlockIQ4_NL*>(bytes);
      out.d = f16_to_f32(block.d);
      for (int j = 0; j < kQBlock; ++j) out.q[j] = kIQ4NLValues[nibble(block.qs, j)];
      break;
    }
    default:
      break;
  }
  return out;
}

}  // namespace

bool is_small_block(DType dtype) {
  return dtype == DType::kQ4_1 || dtype == DType::kQ5_0 || dtype == DType::kQ5_1 ||
         dtype == DType::kIQ4_NL;
}

void matmul_small_block(const MatrixView& w, const float* x, int64_t num_x, float* y) {
  const int64_t num_blocks = w.cols / kQBlock;
  const size_t w_row_bytes = row_bytes(w.dtype, w.cols);
  const size_t w_block_bytes = block_bytes(w.dtype);
  std::vector<int8_t> xq(static_cast<size_t>(w.cols));
  std::vector<float> xd(static_cast<size_t>(num_blocks)), xs(static_cast<size_t>(num_blocks));
  for (int64_t i = 0; i < num_x; ++i) {
    // Q4_1 / Q5_1: ggml's Q8_1 activations, whose sum term s = f16(d * sum q) the minimum
    // multiplies (the other types ignore it).
    quantize_activations_q8(x + i * w.cols, w.cols, xq.data(), xd.data(), xs.data());
    for (int64_t r = 0; r < w.rows; ++r) {
      const auto* row = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w_row_bytes;
      double sum = 0.0;
      for (int64_t b = 0; b < num_blocks; ++b) {
        const IntegerBlock wb = decode(w.dtype, row + static_cast<size_t>(b) * w_block_bytes);
        int32_t sum_wx = 0;
        for (int j = 0; j < kQBlock; ++j) sum_wx += wb.q[j] * xq[b * kQBlock + j];
        sum += static_cast<double>(wb.d) * xd[b] * sum_wx + static_cast<double>(wb.m) * xs[b];
      }
      y[i * w.rows + r] = static_cast<float>(sum);
    }
  }
}

}  // namespace sieve::kernels::ref
