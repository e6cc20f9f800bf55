// Per-target SIMD building blocks and the vector ops (dot, axpy, rmsnorm, silu_mul, softmax).
// Included once per Highway target by foreach_target.h from cpu/*.cc, hence the toggle guard
// instead of #pragma once. Every op here has a scalar twin in ref/ref_ops.cc.
#if defined(SIEVE_KERNELS_CPU_OPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SIEVE_KERNELS_CPU_OPS_INL_H_
#undef SIEVE_KERNELS_CPU_OPS_INL_H_
#else
#define SIEVE_KERNELS_CPU_OPS_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernels/blocks.h"
#include "kernels/ops.h"

HWY_BEFORE_NAMESPACE();
namespace sieve::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ----------------------------------------------------------------------------- loads

// Loads `count` < Lanes(d) values from p, the remaining lanes set to `pad`. Never touches
// memory past p + count (so it is safe at the end of a mapping).
template <class D, typename T = hn::TFromD<D>>
HWY_INLINE hn::Vec<D> LoadTail(D d, const T* HWY_RESTRICT p, size_t count, T pad) {
  HWY_ALIGN T buf[hn::MaxLanes(D())];
  for (size_t i = 0; i < hn::MaxLanes(d); ++i) buf[i] = i < count ? p[i] : pad;
  return hn::Load(d, buf);
}

// Stores the first `count` < Lanes(d) lanes of v to p.
template <class D, typename T = hn::TFromD<D>>
HWY_INLINE void StoreTail(D d, hn::Vec<D> v, T* HWY_RESTRICT p, size_t count) {
  HWY_ALIGN T buf[hn::MaxLanes(D())];
  hn::Store(v, d, buf);
  for (size_t i = 0; i < count; ++i) p[i] = buf[i];
}

// Lanes(df) IEEE halfs at p -> f32, exact for every input (subnormals, inf, NaN). AVX2 and
// up convert in hardware (F16C); older targets use the FP16 library's bit trick (Highway's
// emulation there turns inf/NaN into finite numbers).
template <class DF>
HWY_INLINE hn::Vec<DF> PromoteF16(DF df, const uint16_t* HWY_RESTRICT p) {
#if HWY_TARGET <= HWY_AVX2
  const hn::Rebind<hwy::float16_t, DF> df16;
  return hn::PromoteTo(df, hn::LoadU(df16, reinterpret_cast<const hwy::float16_t*>(p)));
#else
  const hn::RebindToUnsigned<DF> du32;
  const hn::Rebind<uint16_t, DF> du16;
  const auto bits = hn::PromoteTo(du32, hn::LoadU(du16, p));
  const auto w = hn::ShiftLeft<16>(bits);
  const auto sign = hn::And(w, hn::Set(du32, 0x80000000u));
  const auto two_w = hn::Add(w, w);  // exponent and mantissa, sign shifted out
  // Normal, inf, NaN: move exponent+mantissa into place, rebias by 2^-112 (exact).
  const auto normalized =
      hn::Mul(hn::BitCast(df, hn::Add(hn::ShiftRight<4>(two_w), hn::Set(du32, 0xE0u << 23))),
              hn::Set(df, 0x1.0p-112f));
  // Subnormal: mantissa * 2^-24, computed as (0.5 + mantissa * 2^-24) - 0.5 (exact).
  const auto denormalized =
      hn::Sub(hn::BitCast(df, hn::Or(hn::ShiftRight<17>(two_w), hn::Set(du32, 126u << 23))),
              hn::Set(df, 0.5f));
  const auto is_denormal =
      hn::RebindMask(df, hn::Eq(hn::And(bits, hn::Set(du32, 0x7C00u)), hn::Zero(du32)));
  const auto magnitude = hn::IfThenElse(is_denormal, denormalized, normalized);
  return hn::BitCast(df, hn::Or(hn::BitCast(du32, magnitude), sign));
#endif
}

// Lanes(df) bfloat16 at p -> f32 (exact: bf16 is the upper half of an f32).
template <class DF>
HWY_INLINE hn::Vec<DF> PromoteBF16(DF df, const uint16_t* HWY_RESTRICT p) {
  const hn::RebindToUnsigned<DF> du32;
  const hn::Rebind<uint16_t, DF> du16;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, p))));
}

// The f16 at p as f32, through the vector unit. Reads 8 bytes (4 halfs) so that AVX2+ converts
// straight from memory (one vcvtph2ps xmm, m64): p must have 6 readable bytes after it.
HWY_INLINE float F16ToF32(const uint16_t* p) {
  const hn::CappedTag<float, 4> d4;
  return hn::GetLane(PromoteF16(d4, p));
}

// ----------------------------------------------------------------------------- exp

// exp(x) for attention scores minus their max or their rows' log-sum-exp (x <= 0, or -inf): the
// attention's long jobs and decode chunks (cpu/attention-inl.h) and the observation scores
// (cpu/attention_scores.cc). In about half of hn::Exp's instructions (the exp was ~17% of a
// prefill chunk's attention at head_dim 64): t = x log2(e), n = round(t), f = t - n (exact,
// |f| <= 1/2), 2^f by a minimax polynomial of degree 5 (relative error 2.1e-7 in f32, as the
// degree-6 Taylor polynomial of e^f it replaced, which needed a two-part n ln 2 step: 10
// instructions instead of 12), times 2^n by vscalefps; 0 below -87 (no subnormal probabilities,
// which would slow P·V's FMAs) and for -inf. The rounding of t adds |x| 2^-24 ln 2 relative, at
// most ~2e-8 of the largest probability. Other targets take hn::Exp.
#pragma GCC diagnostic push  // GCC 12's false positive about _mm512_undefined in intrinsics
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <class DF>
HWY_INLINE hn::Vec<DF> ExpOfScores(DF d, hn::Vec<DF> x) {
#if HWY_ARCH_X86_64 && HWY_TARGET <= HWY_AVX3
  static_assert(hn::MaxLanes(DF()) == 16);
  (void)d;
  const __m512 v = x.raw;
  const __mmask16 finite = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  const __m512 t = _mm512_mul_ps(v, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 e = _mm512_set1_ps(1.3276472454890609e-3f);
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(9.675540961325169e-3f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(5.550713092088699e-2f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(2.4022120237350464e-1f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(6.931469440460205e-1f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(1.0f));
  return hn::Vec<DF>{_mm512_maskz_scalef_ps(finite, e, n)};
#else
  return hn::Exp(d, x);
#endif
}
#pragma GCC diagnostic pop

// ----------------------------------------------------------------------------- activations

// One row of activations (num_blocks * 32 values) -> Q8_0 blocks, bit-identical to
// quantize_activations_q8 (ggml's x86 quantize_row_q8_0 / q8_1): d = max|x| / 127,
// q = x * (127 / max|x|) rounded half to even. Writes q and d (the f16 scale as f32), and with
// `s` (Q4_1 / Q5_1 weights; may be null) Q8_1's sum term f16(d * sum q), d unrounded. Two
// passes, so the two dependent divisions per block overlap across blocks instead of stalling
// each block's rounding.
HWY_INLINE void QuantizeRowQ8_0(const float* HWY_RESTRICT x, int64_t num_blocks,
                                int8_t* HWY_RESTRICT q, float* HWY_RESTRICT d,
                                float* HWY_RESTRICT s = nullptr) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<int8_t, decltype(df)> d8;
  constexpr size_t kLanes = hn::MaxLanes(decltype(df)());
  static_assert(kQBlock % kLanes == 0);
  constexpr int64_t kChunk = 64;  // blocks per pass
  float inverse[kChunk], scales[kChunk];
  for (int64_t b0 = 0; b0 < num_blocks; b0 += kChunk) {
    const int64_t b1 = std::min(num_blocks, b0 + kChunk);
    for (int64_t b = b0; b < b1; ++b) {
      const float* xb = x + b * kQBlock;
      auto vmax = hn::Zero(df);
      for (size_t k = 0; k < kQBlock; k += kLanes)
        vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, xb + k)));
      const float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
      scales[b - b0] = amax / 127.0f;
      inverse[b - b0] = amax != 0.0f ? 127.0f / amax : 0.0f;
      d[b] = f16_to_f32(f32_to_f16(scales[b - b0]));
    }
    for (int64_t b = b0; b < b1; ++b) {
      const float* xb = x + b * kQBlock;
      const auto id = hn::Set(df, inverse[b - b0]);
      auto sum = hn::Zero(di);
      for (size_t k = 0; k < kQBlock; k += kLanes) {
        const auto rounded = hn::ConvertTo(di, hn::Round(hn::Mul(hn::LoadU(df, xb + k), id)));
        sum = hn::Add(sum, rounded);
        hn::StoreU(hn::DemoteTo(d8, rounded), d8, q + b * kQBlock + k);
      }
      if (s != nullptr) {
        const float q_sum = static_cast<float>(hn::GetLane(hn::SumOfLanes(di, sum)));
        s[b] = f16_to_f32(f32_to_f16(scales[b - b0] * q_sum));
      }
    }
  }
}

// x (n values, a multiple of 32) -> its Q8_0 blocks read back (q * d), in place: what
// block_kv_query makes of a query row already multiplied by its scale, bit for bit.
HWY_INLINE void RoundToQ8Blocks(float* HWY_RESTRICT x, int64_t n) {
  for (int64_t b = 0; b < n / kQBlock; ++b) {
    int8_t q[kQBlock];
    float d;
    QuantizeRowQ8_0(x + b * kQBlock, 1, q, &d);
    for (int64_t j = 0; j < kQBlock; ++j) x[b * kQBlock + j] = static_cast<float>(q[j]) * d;
  }
}

// ----------------------------------------------------------------------------- KV blocks

// n values (a multiple of 32) of Q8_0 (x = d * q) or Q4_1 (x = d * q + m) blocks at src -> f32
// at dst; bit-identical to dequantize_row (the same float operations, no FMA). Lanes of at most
// 16 floats, so that a block is whole vectors on every target. ~2 (Q8_0) / 3 (Q4_1) vector ops
// per Lanes values plus one f16 conversion per block.
HWY_INLINE void DequantizeKvRow(DType dtype, const uint8_t* HWY_RESTRICT src,
                                float* HWY_RESTRICT dst, int64_t n) {
  const hn::CappedTag<float, 16> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t num_blocks = n / kQBlock;
  if (dtype == DType::kQ8_0) {
    const hn::Rebind<int8_t, decltype(df)> d8;
    for (int64_t b = 0; b < num_blocks; ++b, src += sizeof(BlockQ8_0), dst += kQBlock) {
      // d is followed by the 32 quants: F16ToF32's 8-byte read stays inside the block.
      const auto d = hn::Set(df, F16ToF32(reinterpret_cast<const uint16_t*>(src)));
      const auto* qs = reinterpret_cast<const int8_t*>(src + offsetof(BlockQ8_0, qs));
      for (int64_t i = 0; i < kQBlock; i += N) {
        const auto q = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, qs + i)));
        hn::StoreU(hn::Mul(q, d), df, dst + i);
      }
    }
    return;
  }
  const hn::Rebind<uint8_t, decltype(df)> du8;
  const auto low_mask = hn::Set(du8, uint8_t{0xF});
  for (int64_t b = 0; b < num_blocks; ++b, src += sizeof(BlockQ4_1), dst += kQBlock) {
    const auto* dm = reinterpret_cast<const uint16_t*>(src);  // d, m, then 16 bytes of quants
    const auto d = hn::Set(df, F16ToF32(dm));
    const auto m = hn::Set(df, F16ToF32(dm + 1));
    const uint8_t* qs = src + offsetof(BlockQ4_1, qs);
    for (int64_t i = 0; i < kQBlock / 2; i += N) {
      const auto bytes = hn::LoadU(du8, qs + i);
      const auto lo = hn::ConvertTo(df, hn::PromoteTo(di, hn::And(bytes, low_mask)));
      const auto hi = hn::ConvertTo(df, hn::PromoteTo(di, hn::ShiftRight<4>(bytes)));
      hn::StoreU(hn::Add(hn::Mul(lo, d), m), df, dst + i);
      hn::StoreU(hn::Add(hn::Mul(hi, d), m), df, dst + kQBlock / 2 + i);
    }
  }
}

template <class D>
HWY_INLINE float ReduceSum(D d, hn::Vec<D> v) {
  return hn::GetLane(hn::SumOfLanes(d, v));
}

// ----------------------------------------------------------------------------- vector ops
// All single-threaded, n any size >= 0; cost ~n / Lanes vector ops, memory-bound for large n.

// sum_i a[i] * b[i], 4 independent accumulators.
HWY_INLINE float Dot(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  auto sum0 = hn::Zero(d), sum1 = hn::Zero(d), sum2 = hn::Zero(d), sum3 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    sum0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), sum0);
    sum1 = hn::MulAdd(hn::LoadU(d, a + i + N), hn::LoadU(d, b + i + N), sum1);
    sum2 = hn::MulAdd(hn::LoadU(d, a + i + 2 * N), hn::LoadU(d, b + i + 2 * N), sum2);
    sum3 = hn::MulAdd(hn::LoadU(d, a + i + 3 * N), hn::LoadU(d, b + i + 3 * N), sum3);
  }
  for (; i + N <= n; i += N) sum0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), sum0);
  if (i < n) {
    const size_t rest = static_cast<size_t>(n - i);
    sum1 = hn::MulAdd(LoadTail(d, a + i, rest, 0.0f), LoadTail(d, b + i, rest, 0.0f), sum1);
  }
  return ReduceSum(d, hn::Add(hn::Add(sum0, sum1), hn::Add(sum2, sum3)));
}

// y += alpha * x
HWY_INLINE void Axpy(float alpha, const float* HWY_RESTRICT x, float* HWY_RESTRICT y, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto va = hn::Set(d, alpha);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::MulAdd(va, hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, y + i);
  }
  if (i < n) {
    const size_t rest = static_cast<size_t>(n - i);
    StoreTail(d, hn::MulAdd(va, LoadTail(d, x + i, rest, 0.0f), LoadTail(d, y + i, rest, 0.0f)),
              y + i, rest);
  }
}

// out = x / sqrt(mean(x^2) + eps) * weight, with ggml's scale: the f32 squares summed in double,
// the mean rounded to f32, scale = 1.0f / sqrtf(mean + eps). A scale one ulp off moves every
// output, which decides the rounding of the next matmul's Q8 activations where they sit on ties
// (as the normalized rows of 4- and 5-bit embeddings do). Four double chains (the float result
// is that of ggml's one chain unless the double sums straddle a float rounding boundary).
HWY_INLINE void RmsNorm(const float* HWY_RESTRICT x, const float* HWY_RESTRICT weight, float eps,
                        float* HWY_RESTRICT out, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  double sums[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    for (int j = 0; j < 4; ++j) sums[j] += static_cast<double>(x[k + j] * x[k + j]);
  }
  for (; k < n; ++k) sums[0] += static_cast<double>(x[k] * x[k]);
  const double sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  const auto vs = hn::Set(d, scale);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, x + i), vs), hn::LoadU(d, weight + i)), d, out + i);
  }
  if (i < n) {
    const size_t rest = static_cast<size_t>(n - i);
    StoreTail(
        d,
        hn::Mul(hn::Mul(LoadTail(d, x + i, rest, 0.0f), vs), LoadTail(d, weight + i, rest, 0.0f)),
        out + i, rest);
  }
}

// gate = silu(gate) * up = gate / (1 + exp(-gate)) * up
HWY_INLINE void SiluMul(float* HWY_RESTRICT gate, const float* HWY_RESTRICT up, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto one = hn::Set(d, 1.0f);
  const auto silu_mul = [&](hn::Vec<decltype(d)> g, hn::Vec<decltype(d)> u) HWY_ATTR {
    return hn::Mul(hn::Div(g, hn::Add(one, hn::Exp(d, hn::Neg(g)))), u);
  };
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(silu_mul(hn::LoadU(d, gate + i), hn::LoadU(d, up + i)), d, gate + i);
  }
  if (i < n) {
    const size_t rest = static_cast<size_t>(n - i);
    StoreTail(d, silu_mul(LoadTail(d, gate + i, rest, 0.0f), LoadTail(d, up + i, rest, 0.0f)),
              gate + i, rest);
  }
}

// x = exp(x - max) / sum(exp(x - max)) in place; returns max (-inf for n == 0).
// Three passes: max, exp + sum (stored), scale.
HWY_INLINE float Softmax(float* HWY_RESTRICT x, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // Nothing: -inf, said here (EMU128's MaxOfLanes of -inf lanes gives the lowest finite float).
  if (n == 0) return kNegInf;
  const size_t rest = static_cast<size_t>(n % N);
  const int64_t n_full = n - static_cast<int64_t>(rest);

  auto vmax = hn::Set(d, kNegInf);
  for (int64_t i = 0; i < n_full; i += N) vmax = hn::Max(vmax, hn::LoadU(d, x + i));
  if (rest != 0) vmax = hn::Max(vmax, LoadTail(d, x + n_full, rest, kNegInf));
  const float max = hn::GetLane(hn::MaxOfLanes(d, vmax));
  vmax = hn::Set(d, max);

  // Padding lanes hold -inf, and Exp(-inf) == 0, so they add nothing to the sum.
  auto vsum = hn::Zero(d);
  for (int64_t i = 0; i < n_full; i += N) {
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, x + i), vmax));
    hn::StoreU(e, d, x + i);
    vsum = hn::Add(vsum, e);
  }
  if (rest != 0) {
    const auto e = hn::Exp(d, hn::Sub(LoadTail(d, x + n_full, rest, kNegInf), vmax));
    StoreTail(d, e, x + n_full, rest);
    vsum = hn::Add(vsum, e);
  }

  const auto vscale = hn::Set(d, 1.0f / ReduceSum(d, vsum));
  for (int64_t i = 0; i < n_full; i += N)
    hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vscale), d, x + i);
  if (rest != 0) {
    StoreTail(d, hn::Mul(LoadTail(d, x + n_full, rest, 0.0f), vscale), x + n_full, rest);
  }
  return max;
}

// x <- H x / sqrt(n) in place for one head of n (a power of two) values, H the Walsh–Hadamard
// matrix in Sylvester order: log2(n) butterfly stages (a, b) -> (a + b, a - b) at strides 1, 2,
// 4, ...; strides of a vector or more run on whole vectors, the smaller ones on scalars (log2
// Lanes stages), then one scaling pass. Cost n log2(n) adds.
HWY_INLINE void RotateHead(float* HWY_RESTRICT x, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t h = 1;
  for (; h < n && h < N; h *= 2) {
    for (int64_t i = 0; i < n; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  for (; h < n; h *= 2) {
    for (int64_t i = 0; i < n; i += 2 * h) {
      for (int64_t j = i; j < i + h; j += N) {
        const auto a = hn::LoadU(d, x + j), b = hn::LoadU(d, x + j + h);
        hn::StoreU(hn::Add(a, b), d, x + j);
        hn::StoreU(hn::Sub(a, b), d, x + j + h);
      }
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), hn::Set(d, scale)), d, x + i);
  for (; i < n; ++i) x[i] *= scale;
}

}  // namespace sieve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SIEVE_KERNELS_CPU_OPS_INL_H_ toggle
