// Scalar (de)quantization of the ggml blocks of 32 beyond Q8_0 / Q4_0: Q4_1, Q5_0, Q5_1,
// IQ4_NL (layouts in blocks.h). The quantizers are ggml's deterministic ones, the arithmetic
// in the same float order, so they reproduce llama-quantize's bytes (without an imatrix):
//   Q4_1 / Q5_1  affine: m = min, d = (max - min) / (2^bits - 1), q = trunc((x - m) / d + 0.5)
//   Q5_0         symmetric: d = (value of largest magnitude) / -16, q = trunc(x / d + 16.5)
//   IQ4_NL       d chosen by a weighted least-squares search over 15 candidate scales
// Cost: Q4_1/Q5_0/Q5_1 a few ns per value; IQ4_NL ~16 passes over each block.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "kernels/blocks.h"
#include "kernels/quant_formats.h"
#include "util/error.h"

namespace sieve::kernels::quant {

namespace {

// Element j of a block of 32 sits in byte j % 16 of qs: low nibble for j < 16, high for j >= 16.
uint8_t pack_nibbles(int low, int high) {
  return static_cast<uint8_t>((low & 0xF) | ((high & 0xF) << 4));
}

// Bit j of qh (32-bit little endian) is bit 4 of element j's 5-bit quant.
uint32_t load_qh(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, sizeof(bits));
  return bits;
}
int fifth_bit(uint32_t qh, int j) { return static_cast<int>((qh >> j) & 1u) << 4; }

struct MinMax {
  float min = FLT_MAX, max = -FLT_MAX;
};
MinMax min_max(const float* x) {
  MinMax mm;
  for (int64_t j = 0; j < kQBlock; ++j) {
    if (x[j] < mm.min) mm.min = x[j];
    if (x[j] > mm.max) mm.max = x[j];
  }
  return mm;
}

// The value of largest magnitude (the first one on ties), with its sign.
float signed_absmax(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int64_t j = 0; j < kQBlock; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

// ggml's quantize_row_q4_1_ref. (int8_t) truncates toward zero: q >= 0 here, so it rounds
// half up; min(15) catches float overshoot at the top.
void quantize_block_q4_1(const float* x, BlockQ4_1* block) {
  const MinMax mm = min_max(x);
  const float d = (mm.max - mm.min) / 15.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  block->d = f32_to_f16(d);
  block->m = f32_to_f16(mm.min);
  for (int64_t j = 0; j < kQBlock / 2; ++j) {
    const int lo = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - mm.min) * id + 0.5f)));
    const int hi =
        std::min(15, static_cast<int>(static_cast<int8_t>((x[j + 16] - mm.min) * id + 0.5f)));
    block->qs[j] = pack_nibbles(lo, hi);
  }
}

// ggml's quantize_row_q5_0_ref: as Q4_0 with 32 levels (the extreme value maps to -16).
void quantize_block_q5_0(const float* x, BlockQ5_0* block) {
  const float d = signed_absmax(x) / -16.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  block->d = f32_to_f16(d);
  uint32_t qh = 0;
  for (int64_t j = 0; j < kQBlock / 2; ++j) {
    const int lo = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
    const int hi = std::min(31, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 16.5f)));
    block->qs[j] = pack_nibbles(lo, hi);
    qh |= static_cast<uint32_t>((lo >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((hi >> 4) & 1) << (j + 16);
  }
  std::memcpy(block->qh, &qh, sizeof(qh));
}

// ggml's quantize_row_q5_1_ref (no clamp there: (uint8_t) of at most 31.5 + rounding error).
void quantize_block_q5_1(const float* x, BlockQ5_1* block) {
  const MinMax mm = min_max(x);
  const float d = (mm.max - mm.min) / 31.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  block->d = f32_to_f16(d);
  block->m = f32_to_f16(mm.min);
  uint32_t qh = 0;
  for (int64_t j = 0; j < kQBlock / 2; ++j) {
    const int lo = static_cast<uint8_t>((x[j] - mm.min) * id + 0.5f);
    const int hi = static_cast<uint8_t>((x[j + 16] - mm.min) * id + 0.5f);
    block->qs[j] = pack_nibbles(lo, hi);
    qh |= static_cast<uint32_t>((lo >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((hi >> 4) & 1) << (j + 16);
  }
  std::memcpy(block->qh, &qh, sizeof(qh));
}

// ggml's quantize_iq4_nl without an imatrix (quantize_row_iq4_nl_impl with one block of 32 and
// ntry = 7): weights w = x^2; start from the scale that maps the extreme value to -127, take
// the least-squares d = sum(w q x) / sum(w q^2) of its levels, then try the inverse scales
// (k - 127) / max for k in [-7, 7] and keep the d of largest sum(w q x)^2 / sum(w q^2); finally
// re-pick every level with the chosen d.
void quantize_block_iq4_nl(const float* x, BlockIQ4_NL* block) {
  constexpr float kGroupMaxEps = 1e-15f;  // ggml's GROUP_MAX_EPS: below it the block is zero
  constexpr int kTries = 7;
  float weight[kQBlock];
  for (int64_t j = 0; j < kQBlock; ++j) weight[j] = x[j] * x[j];
  float amax = 0.0f, max = 0.0f;
  for (int64_t j = 0; j < kQBlock; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  float scale = 0.0f;
  if (amax >= kGroupMaxEps) {
    // Both sums of one candidate inverse scale, accumulated in ggml's order.
    const auto fit = [&](float inverse, float* sum_qx, float* sum_q2) {
      *sum_qx = 0.0f;
      *sum_q2 = 0.0f;
      for (int64_t j = 0; j < kQBlock; ++j) {
        const float q = kIQ4NLValues[nearest_iq4nl_level(inverse * x[j])];
        *sum_qx += weight[j] * q * x[j];
        *sum_q2 += weight[j] * q * q;
      }
    };
    const float d0 = -max / kIQ4NLValues[0];
    float sum_qx, sum_q2;
    fit(1.0f / d0, &sum_qx, &sum_q2);
    scale = sum_qx / sum_q2;
    float best = scale * sum_qx;
    for (int step = -kTries; step <= kTries; ++step) {
      fit(static_cast<float>(step + kIQ4NLValues[0]) / max, &sum_qx, &sum_q2);
      if (sum_q2 > 0.0f && sum_qx * sum_qx > best * sum_q2) {
        scale = sum_qx / sum_q2;
        best = scale * sum_qx;
      }
    }
  }
  block->d = f32_to_f16(scale);
  const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
  for (int64_t j = 0; j < kQBlock / 2; ++j) {
    block->qs[j] =
        pack_nibbles(nearest_iq4nl_level(inverse * x[j]), nearest_iq4nl_level(inverse * x[j + 16]));
  }
}

template <class Block, class QuantizeBlock>
void quantize_blocks(const float* src, void* dst, int64_t n, QuantizeBlock quantize_block) {
  auto* blocks = static_cast<Block*>(dst);
  for (int64_t b = 0; b < n / kQBlock; ++b) quantize_block(src + b * kQBlock, &blocks[b]);
}

// ggml's dequantize_row_*: x = q * d (+ m), in float, element by element.
void dequantize_q4_1(const BlockQ4_1& block, float* x) {
  const float d = f16_to_f32(block.d), m = f16_to_f32(block.m);
  for (int64_t j = 0; j < kQBlock / 2; ++j) {
    x[j] = static_cast<float>(block.qs[j] & 0xF) * d + m;
    x[j + 16] = static_cast<float>(block.qs[j] >> 4) * d + m;
  }
}
void dequantize_q5_0(const BlockQ5_0& block, float* x) {
  const float d = f16_to_f32(block.d);
  const uint32_t qh = load_qh(block.qh);
  for (int j = 0; j < kQBlock / 2; ++j) {
    x[j] = static_cast<float>(((block.qs[j] & 0xF) | fifth_bit(qh, j)) - 16) * d;
    x[j + 16] = static_cast<float>(((block.qs[j] >> 4) | fifth_bit(qh, j + 16)) - 16) * d;
  }
}
void dequantize_q5_1(const BlockQ5_1& block, float* x) {
  const float d = f16_to_f32(block.d), m = f16_to_f32(block.m);
  const uint32_t qh = load_qh(block.qh);
  for (int j = 0; j < kQBlock / 2; ++j) {
    x[j] = static_cast<float>((block.qs[j] & 0xF) | fifth_bit(qh, j)) * d + m;
    x[j + 16] = static_cast<float>((block.qs[j] >> 4) | fifth_bit(qh, j + 16)) * d + m;
  }
}
void dequantize_iq4_nl(const BlockIQ4_NL& block, float* x) {
  const float d = f16_to_f32(block.d);
  for (int64_t j = 0; j < kQBlock / 2; ++j) {
    x[j] = d * static_cast<float>(kIQ4NLValues[block.qs[j] & 0xF]);
    x[j + 16] = d * static_cast<float>(kIQ4NLValues[block.qs[j] >> 4]);
  }
}

template <class Block, class DequantizeBlock>
void dequantize_blocks(const void* src, float* dst, int64_t n, DequantizeBlock dequantize_block) {
  const auto* blocks = static_cast<const Block*>(src);
  for (int64_t b = 0; b < n / kQBlock; ++b) dequantize_block(blocks[b], dst + b * kQBlock);
}

}  // namespace

void quantize_row_q4_1(const float* src, void* dst, int64_t n) {
  quantize_blocks<BlockQ4_1>(src, dst, n, quantize_block_q4_1);
}
void quantize_row_q5_0(const float* src, void* dst, int64_t n) {
  quantize_blocks<BlockQ5_0>(src, dst, n, quantize_block_q5_0);
}
void quantize_row_q5_1(const float* src, void* dst, int64_t n) {
  quantize_blocks<BlockQ5_1>(src, dst, n, quantize_block_q5_1);
}
void quantize_row_iq4_nl(const float* src, void* dst, int64_t n) {
  quantize_blocks<BlockIQ4_NL>(src, dst, n, quantize_block_iq4_nl);
}

void dequantize_row_q4_1(const void* src, float* dst, int64_t n) {
  dequantize_blocks<BlockQ4_1>(src, dst, n, dequantize_q4_1);
}
void dequantize_row_q5_0(const void* src, float* dst, int64_t n) {
  dequantize_blocks<BlockQ5_0>(src, dst, n, dequantize_q5_0);
}
void dequantize_row_q5_1(const void* src, float* dst, int64_t n) {
  dequantize_blocks<BlockQ5_1>(src, dst, n, dequantize_q5_1);
}
void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n) {
  dequantize_blocks<BlockIQ4_NL>(src, dst, n, dequantize_iq4_nl);
}

}  // namespace sieve::kernels::quant
