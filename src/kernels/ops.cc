// The scalar conversions (bit-exact with ggml) and row (de)quantization.
// The SIMD kernels live in cpu/, the scalar references in ref/.
#include "kernels/ops.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <iterator>
#include <new>

#include "kernels/blocks.h"
#include "kernels/quant_formats.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace sieve::kernels {

// The block structs are the table's layouts.
static_assert(block_bytes(DType::kQ8_0) == sizeof(BlockQ8_0) &&
              block_bytes(DType::kQ4_0) == sizeof(BlockQ4_0) &&
              block_bytes(DType::kQ4_1) == sizeof(BlockQ4_1) &&
              block_bytes(DType::kQ5_0) == sizeof(BlockQ5_0) &&
              block_bytes(DType::kQ5_1) == sizeof(BlockQ5_1) &&
              block_bytes(DType::kIQ4_NL) == sizeof(BlockIQ4_NL) &&
              block_bytes(DType::kQ2_K) == sizeof(BlockQ2_K) &&
              block_bytes(DType::kQ3_K) == sizeof(BlockQ3_K) &&
              block_bytes(DType::kQ4_K) == sizeof(BlockQ4_K) &&
              block_bytes(DType::kQ5_K) == sizeof(BlockQ5_K) &&
              block_bytes(DType::kQ6_K) == sizeof(BlockQ6_K) &&
              block_bytes(DType::kIQ4_XS) == sizeof(BlockIQ4_XS));
static_assert(block_elems(DType::kQ8_0) == kQBlock && block_elems(DType::kQ2_K) == kQKBlock);

// ---------------------------------------------------------------------------- conversions

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {  // inf / NaN (payload kept)
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {  // normal
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  } else if (mant == 0) {  // +-0
    bits = sign;
  } else {  // subnormal: mant * 2^-24, renormalised
    uint32_t e = 127 - 15 + 1;
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mant & 0x3FF) << 13);
  }
  return std::bit_cast<float>(bits);
}

// ggml's ggml_compute_fp32_to_fp16 (from the FP16 library): round to nearest even through
// float arithmetic; NaN becomes a quiet NaN 0x7E00 with the sign kept.
uint16_t f32_to_f16(float f) {
  const float scale_to_inf = 0x1.0p+112f;
  const float scale_to_zero = 0x1.0p-110f;
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = std::bit_cast<uint32_t>(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = std::bit_cast<float>((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = std::bit_cast<uint32_t>(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// ggml's ggml_compute_fp32_to_bf16.
uint16_t f32_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 64);  // quiet NaN
  return static_cast<uint16_t>((u + (0x7FFFu + ((u >> 16) & 1))) >> 16);
}

// ---------------------------------------------------------------------------- quantization

namespace {

// ggml's quantize_row_q8_0_ref for one block of 32 values:
//   amax = max|x|, d = amax / 127, id = d ? 1/d : 0, q[j] = roundf(x[j] * id)
// Writes q[0..32) and returns d rounded to f16. The matmul's SIMD activation quantizer
// (cpu/matmul-inl.h) matches this bit for bit (tested).
uint16_t quantize_block_q8_0(const float* x, int8_t* q) {
  float amax = 0.0f;
  for (int64_t j = 0; j < kQBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int64_t j = 0; j < kQBlock; ++j) q[j] = static_cast<int8_t>(std::roundf(x[j] * id));
  return f32_to_f16(d);
}

// ggml's quantize_row_q4_0_ref for one block: the scale maps the value of largest magnitude
// to -8, d = max / -8, q = min(15, (int)(x / d + 8.5)).
void quantize_block_q4_0(const float* x, BlockQ4_0* block) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int64_t j = 0; j < kQBlock; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  block->d = f32_to_f16(d);
  for (int64_t j = 0; j < kQBlock / 2; ++j) {
    const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
    const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
    block->qs[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void quantize_row_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
void quantize_row_f16(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_f16(src[i]);
}
void quantize_row_bf16(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(src[i]);
}
void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ8_0*>(dst);
  for (int64_t b = 0; b < n / kQBlock; ++b) {
    blocks[b].d = quantize_block_q8_0(src + b * kQBlock, blocks[b].qs);
  }
}
void quantize_row_q4_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ4_0*>(dst);
  for (int64_t b = 0; b < n / kQBlock; ++b) quantize_block_q4_0(src + b * kQBlock, &blocks[b]);
}

void dequantize_row_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
void dequantize_row_f16(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(static_cast<const uint16_t*>(src)[i]);
}
void dequantize_row_bf16(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
}
void dequantize_row_q8_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ8_0*>(src);
  for (int64_t b = 0; b < n / kQBlock; ++b) {
    const float d = f16_to_f32(blocks[b].d);
    for (int64_t j = 0; j < kQBlock; ++j) dst[b * kQBlock + j] = d * blocks[b].qs[j];
  }
}
void dequantize_row_q4_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_0*>(src);
  for (int64_t b = 0; b < n / kQBlock; ++b) {
    const float d = f16_to_f32(blocks[b].d);
    float* out = dst + b * kQBlock;
    for (int64_t j = 0; j < kQBlock / 2; ++j) {
      out[j] = d * ((blocks[b].qs[j] & 0xF) - 8);
      out[j + 16] = d * ((blocks[b].qs[j] >> 4) - 8);
    }
  }
}

// Every dtype's scalar row quantizer and dequantizer, in DType order: the one place
// quantize_row() and dequantize_row() choose by type.
struct RowCodec {
  void (*quantize)(const float* src, void* dst, int64_t n);
  void (*dequantize)(const void* src, float* dst, int64_t n);
};
constexpr RowCodec kRowCodecs[] = {
    {quantize_row_f32, dequantize_row_f32},
    {quantize_row_f16, dequantize_row_f16},
    {quantize_row_bf16, dequantize_row_bf16},
    {quantize_row_q8_0, dequantize_row_q8_0},
    {quantize_row_q4_0, dequantize_row_q4_0},
    {quant::quantize_row_q4_1, quant::dequantize_row_q4_1},
    {quant::quantize_row_q5_0, quant::dequantize_row_q5_0},
    {quant::quantize_row_q5_1, quant::dequantize_row_q5_1},
    {quant::quantize_row_iq4_nl, quant::dequantize_row_iq4_nl},
    {quant::quantize_row_q2_k, quant::dequantize_row_q2_k},
    {quant::quantize_row_q3_k, quant::dequantize_row_q3_k},
    {quant::quantize_row_q4_k, quant::dequantize_row_q4_k},
    {quant::quantize_row_q5_k, quant::dequantize_row_q5_k},
    {quant::quantize_row_q6_k, quant::dequantize_row_q6_k},
    {quant::quantize_row_iq4_xs, quant::dequantize_row_iq4_xs},
};
static_assert(std::size(kRowCodecs) == std::size(kAllDTypes), "one codec per DType, in its order");

}  // namespace

void quantize_row(DType dtype, const float* src, void* dst, int64_t n) {
  assert(n % block_elems(dtype) == 0);
  kRowCodecs[static_cast<size_t>(dtype)].quantize(src, dst, n);
}

void dequantize_row(DType dtype, const void* src, float* dst, int64_t n) {
  assert(n % block_elems(dtype) == 0);
  kRowCodecs[static_cast<size_t>(dtype)].dequantize(src, dst, n);
}

void quantize_activations_q8(const float* x, int64_t n, int8_t* q, float* d, float* s) {
  assert(n % kQBlock == 0);
  for (int64_t b = 0; b < n / kQBlock; ++b) {
    const float* xb = x + b * kQBlock;
    float amax = 0.0f;
    for (int64_t j = 0; j < kQBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float scale = amax / 127.0f;
    const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int64_t j = 0; j < kQBlock; ++j) {
      const int32_t v = static_cast<int32_t>(std::nearbyint(xb[j] * inverse));  // ties to even
      q[b * kQBlock + j] = static_cast<int8_t>(v);
      sum += v;
    }
    d[b] = f16_to_f32(f32_to_f16(scale));
    if (s != nullptr) s[b] = f16_to_f32(f32_to_f16(scale * static_cast<float>(sum)));
  }
}

constexpr size_t kHugePageBytes = size_t{2} << 20;  // x86-64's transparent huge pages

void* allocate_packed(size_t bytes) {
  if (bytes < kHugePageBytes) return ::operator new (bytes, std::align_val_t{64});
  void* p = ::operator new (bytes, std::align_val_t{kHugePageBytes});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Before the first write: the faults then map huge pages where the kernel has them. A hint.
  madvise(p, bytes / kHugePageBytes * kHugePageBytes, MADV_HUGEPAGE);
#endif
  return p;
}

void free_packed(void* p, size_t bytes) {
  ::operator delete (p, std::align_val_t{bytes < kHugePageBytes ? 64 : kHugePageBytes});
}

}  // namespace sieve::kernels
