// Scalar (de)quantization of the ggml super-block types (Q2_K .. Q6_K, IQ4_XS) and of Q8_K
// activations: see quant_super_blocks.h for the decodings. The quantizers follow ggml's reference
// algorithms operation for operation (same float expressions in the same order, no FMA
// contraction: this library builds with -ffp-contract=off), so that they reproduce the bytes
// llama-quantize writes without an importance matrix (tested on every tensor of the golden files).
#include "kernels/quant_super_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/blocks.h"
#include "kernels/quant_formats.h"
#include "util/error.h"

namespace sieve::kernels::quant {

namespace {

// ggml's nearest_int: round half to even through the float mantissa (|x| < 2^22).
int nearest_int(float x) {
  const float shifted = x + 12582912.0f;  // 1.5 * 2^23
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof(bits));
  return (bits & 0x007FFFFF) - 0x00400000;
}

constexpr float kGroupMaxEps = 1e-15f;  // below this a group counts as all zero

// ---------------------------------------------------------------------------- decoding

void decode_q2_k(const BlockQ2_K& b, SuperBlockInts* out) {
  out->d = f16_to_f32(b.d);
  out->dmin = f16_to_f32(b.dmin);
  for (int s = 0; s < 16; ++s) {
    out->scales[s] = b.scales[s] & 0xF;
    out->mins[s] = b.scales[s] >> 4;
  }
  for (int e = 0; e < kQKBlock; ++e) {
    const int half = e / 128, shift = 2 * ((e % 128) / 32), l = e % 32;
    out->q[e] = (b.qs[32 * half + l] >> shift) & 3;
  }
}

void decode_q3_k(const BlockQ3_K& b, SuperBlockInts* out) {
  out->d = f16_to_f32(b.d);
  out->dmin = 0.0f;
  for (int s = 0; s < 16; ++s) {
    out->scales[s] = scale_q3_k(s, b.scales) - 32;
    out->mins[s] = 0;
  }
  for (int e = 0; e < kQKBlock; ++e) {
    const int half = e / 128, j = (e % 128) / 32, l = e % 32;
    const int low = (b.qs[32 * half + l] >> (2 * j)) & 3;
    const bool high = (b.hmask[l] >> (4 * half + j)) & 1;
    out->q[e] = high ? low : low - 4;
  }
}

void decode_q4_k(const BlockQ4_K& b, SuperBlockInts* out) {
  out->d = f16_to_f32(b.d);
  out->dmin = f16_to_f32(b.dmin);
  for (int j = 0; j < 8; ++j) {
    int scale, min;
    scale_min_k4(j, b.scales, &scale, &min);
    out->scales[2 * j] = out->scales[2 * j + 1] = scale;
    out->mins[2 * j] = out->mins[2 * j + 1] = min;
  }
  for (int e = 0; e < kQKBlock; ++e) {
    const uint8_t byte = b.qs[32 * (e / 64) + e % 32];
    out->q[e] = (e % 64) < 32 ? byte & 0xF : byte >> 4;
  }
}

void decode_q5_k(const BlockQ5_K& b, SuperBlockInts* out) {
  out->d = f16_to_f32(b.d);
  out->dmin = f16_to_f32(b.dmin);
  for (int j = 0; j < 8; ++j) {
    int scale, min;
    scale_min_k4(j, b.scales, &scale, &min);
    out->scales[2 * j] = out->scales[2 * j + 1] = scale;
    out->mins[2 * j] = out->mins[2 * j + 1] = min;
  }
  for (int e = 0; e < kQKBlock; ++e) {
    const uint8_t byte = b.qs[32 * (e / 64) + e % 32];
    const int low = (e % 64) < 32 ? byte & 0xF : byte >> 4;
    const int high = (b.qh[e % 32] >> (e / 32)) & 1;
    out->q[e] = low | (high << 4);
  }
}

void decode_q6_k(const BlockQ6_K& b, SuperBlockInts* out) {
  out->d = f16_to_f32(b.d);
  out->dmin = 0.0f;
  for (int s = 0; s < 16; ++s) {
    out->scales[s] = b.scales[s];
    out->mins[s] = 0;
  }
  for (int e = 0; e < kQKBlock; ++e) {
    const int half = e / 128, k = (e % 128) / 32, l = e % 32;
    const uint8_t low_byte = b.ql[64 * half + 32 * (k & 1) + l];
    const int low = (k >> 1) ? low_byte >> 4 : low_byte & 0xF;
    const int high = (b.qh[32 * half + l] >> (2 * k)) & 3;
    out->q[e] = (low | (high << 4)) - 32;
  }
}

void decode_iq4_xs(const BlockIQ4_XS& b, SuperBlockInts* out) {
  out->d = f16_to_f32(b.d);
  out->dmin = 0.0f;
  for (int ib = 0; ib < 8; ++ib) {
    const int low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
    const int high = (b.scales_h >> (2 * ib)) & 3;
    out->scales[2 * ib] = out->scales[2 * ib + 1] = (low | (high << 4)) - 32;
    out->mins[2 * ib] = out->mins[2 * ib + 1] = 0;
  }
  for (int e = 0; e < kQKBlock; ++e) {
    const uint8_t byte = b.qs[16 * (e / 32) + e % 16];
    out->q[e] = kIQ4NLValues[(e % 32) < 16 ? byte & 0xF : byte >> 4];
  }
}

// ---------------------------------------------------------------------------- quantizing

// ggml's make_qkx2_quants: asymmetric n-value group -> L[i] in [0, nmax] with
// x ~ scale * L - min, searching nstep + 1 candidate scales around nmax / (max - min) and
// refitting scale and min by weighted least squares. Returns scale; *neg_min = -min >= 0.
float fit_scale_min(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                    float* neg_min, uint8_t* L_try, float rmin, float rdelta, int nstep,
                    bool use_mad) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *neg_min = -min;
    return 0.0f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *neg_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      L_try[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * L_try[i] + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        error += weights[i] * diff;
      }
      if (error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = L_try[i];
        best_error = error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min = -min;
  return scale;
}

// ggml's make_qx_quants with rmse_type 1 and no importance weights (weights x^2): symmetric
// group -> L[i] in [0, 2 * nmax) with x ~ scale * (L - nmax), the sign of scale chosen so that
// the value of largest magnitude maps to -nmax; tries 18 scales around it. Returns scale.
float fit_scale_symmetric(int n, int nmax, const float* x, int8_t* L) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  float iscale = -nmax / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// ggml's make_q3_quants with do_rmse: like fit_scale_symmetric's start, then up to 5 rounds of
// moving single values to a better level. L[i] in [0, 2 * nmax).
float fit_scale_q3(int n, int nmax, const float* x, int8_t* L) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  const float iscale = -nmax / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int round = 0; round < 5; ++round) {
    int num_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx > 0) {
        float sl2 = suml2 - w * L[i] * L[i];
        int new_l = nearest_int(x[i] * sl2 / slx);
        new_l = std::max(-nmax, std::min(nmax - 1, new_l));
        if (new_l != L[i]) {
          slx += w * x[i] * new_l;
          sl2 += w * new_l * new_l;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++num_changed;
          }
        }
      }
    }
    if (num_changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Packs 8 6-bit scales and mins the Q4_K / Q5_K way (inverse of scale_min_k4).
void pack_scales_k4(const uint8_t* ls, const uint8_t* lm, uint8_t* s) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] = ls[j];
      s[j + 4] = lm[j];
    } else {
      s[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      s[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
      s[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
    }
  }
}

// Q4_K / Q5_K (nmax 15 / 31): per 32 values fit_scale_min with weights av_x + |x|, then the 8
// scales and mins quantized to 6 bits against d = max_scale / 63, dmin = max_min / 63, then
// every value requantized with the rounded scales. Writes d, dmin, scales; L gets the levels.
template <class Block>
void quantize_k4_scales_and_levels(const float* x, int nmax, float rmin, int nstep, Block* y,
                                   uint8_t* L) {
  uint8_t L_try[32];
  float weights[32];
  float mins[8];
  float scales[8];
  float max_scale = 0;
  float max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = fit_scale_min(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], L_try, rmin,
                              0.1f, nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    // ggml stores nearest_int into a uint8_t before clamping: the same wrap-around here.
    ls[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    lm[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
  }
  pack_scales_k4(ls, lm, y->scales);
  y->d = f32_to_f16(max_scale / 63.f);
  y->dmin = f32_to_f16(max_min / 63.f);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    scale_min_k4(j, y->scales, &sc, &m);
    const float d = f16_to_f32(y->d) * sc;
    if (!d) continue;
    const float dm = f16_to_f32(y->dmin) * m;
    for (int i = 0; i < 32; ++i) {
      const int l = nearest_int((x[32 * j + i] + dm) / d);
      L[32 * j + i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    }
  }
}

void quantize_q4_k(const float* x, BlockQ4_K* y) {
  uint8_t L[kQKBlock];
  quantize_k4_scales_and_levels(x, 15, -1.f, 20, y, L);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l)
      y->qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
  }
}

void quantize_q5_k(const float* x, BlockQ5_K* y) {
  uint8_t L[kQKBlock];
  quantize_k4_scales_and_levels(x, 31, -0.5f, 15, y, L);
  std::memset(y->qh, 0, sizeof(y->qh));
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int low = L[64 * c + l], high = L[64 * c + 32 + l];
      y->qs[32 * c + l] = static_cast<uint8_t>((low & 0xF) | ((high & 0xF) << 4));
      y->qh[l] |= static_cast<uint8_t>(((low >> 4) << (2 * c)) | ((high >> 4) << (2 * c + 1)));
    }
  }
}

void quantize_q6_k(const float* x, BlockQ6_K* y) {
  int8_t L[kQKBlock];
  float scales[16];
  float max_scale = 0;
  float max_abs_scale = 0;
  for (int s = 0; s < 16; ++s) {
    scales[s] = fit_scale_symmetric(16, 32, x + 16 * s, L + 16 * s);
    if (std::fabs(scales[s]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[s]);
      max_scale = scales[s];
    }
  }
  if (max_abs_scale < kGroupMaxEps) {
    std::memset(y, 0, sizeof(*y));
    return;
  }
  const float iscale = -128.f / max_scale;
  y->d = f32_to_f16(1 / iscale);
  for (int s = 0; s < 16; ++s)
    y->scales[s] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[s])));
  for (int s = 0; s < 16; ++s) {
    const float d = f16_to_f32(y->d) * y->scales[s];
    if (!d) continue;
    for (int i = 0; i < 16; ++i) {
      const int l = nearest_int(x[16 * s + i] / d);
      L[16 * s + i] = static_cast<int8_t>(std::max(-32, std::min(31, l)) + 32);
    }
  }
  for (int half = 0; half < 2; ++half) {
    const int8_t* Lh = L + 128 * half;
    for (int l = 0; l < 32; ++l) {
      y->ql[64 * half + l] = static_cast<uint8_t>((Lh[l] & 0xF) | ((Lh[64 + l] & 0xF) << 4));
      y->ql[64 * half + 32 + l] =
          static_cast<uint8_t>((Lh[32 + l] & 0xF) | ((Lh[96 + l] & 0xF) << 4));
      y->qh[32 * half + l] =
          static_cast<uint8_t>((Lh[l] >> 4) | ((Lh[32 + l] >> 4) << 2) | ((Lh[64 + l] >> 4) << 4) |
                               ((Lh[96 + l] >> 4) << 6));
    }
  }
}

// Q2_K and Q3_K store levels of 128 values as 32 bytes of four 2-bit fields (value 32k + l in
// bits 2k..2k+1 of byte l).
void pack_2bit_levels(const uint8_t* L, uint8_t* qs) {
  for (int half = 0; half < 2; ++half) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t* Lh = L + 128 * half;
      qs[32 * half + l] =
          static_cast<uint8_t>(Lh[l] | (Lh[32 + l] << 2) | (Lh[64 + l] << 4) | (Lh[96 + l] << 6));
    }
  }
}

void quantize_q2_k(const float* x, BlockQ2_K* y) {
  uint8_t L[kQKBlock];
  uint8_t L_try[16];
  float weights[16];
  float mins[16];
  float scales[16];
  float max_scale = 0;
  float max_min = 0;
  for (int s = 0; s < 16; ++s) {
    for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * s + l]);
    scales[s] = fit_scale_min(16, 3, x + 16 * s, weights, L + 16 * s, &mins[s], L_try, -0.5f, 0.1f,
                              15, true);
    if (scales[s] > max_scale) max_scale = scales[s];
    if (mins[s] > max_min) max_min = mins[s];
  }
  if (max_scale > 0) {
    const float iscale = 15.f / max_scale;
    for (int s = 0; s < 16; ++s)
      y->scales[s] = static_cast<uint8_t>(nearest_int(iscale * scales[s]));
    y->d = f32_to_f16(max_scale / 15.f);
  } else {
    for (int s = 0; s < 16; ++s) y->scales[s] = 0;
    y->d = f32_to_f16(0.f);
  }
  if (max_min > 0) {
    const float iscale = 15.f / max_min;
    for (int s = 0; s < 16; ++s)
      y->scales[s] |= static_cast<uint8_t>(nearest_int(iscale * mins[s]) << 4);
    y->dmin = f32_to_f16(max_min / 15.f);
  } else {
    y->dmin = f32_to_f16(0.f);
  }
  for (int s = 0; s < 16; ++s) {
    const float d = f16_to_f32(y->d) * (y->scales[s] & 0xF);
    if (!d) continue;
    const float dm = f16_to_f32(y->dmin) * (y->scales[s] >> 4);
    for (int i = 0; i < 16; ++i) {
      const int l = nearest_int((x[16 * s + i] + dm) / d);
      L[16 * s + i] = static_cast<uint8_t>(std::max(0, std::min(3, l)));
    }
  }
  pack_2bit_levels(L, y->qs);
}

void quantize_q3_k(const float* x, BlockQ3_K* y) {
  int8_t L[kQKBlock];
  float scales[16];
  float max_scale = 0;
  float amax = 0;
  for (int s = 0; s < 16; ++s) {
    scales[s] = fit_scale_q3(16, 4, x + 16 * s, L + 16 * s);
    if (std::fabs(scales[s]) > amax) {
      amax = std::fabs(scales[s]);
      max_scale = scales[s];
    }
  }
  std::memset(y->scales, 0, sizeof(y->scales));
  if (max_scale) {
    const float iscale = -32.f / max_scale;
    for (int s = 0; s < 16; ++s) {
      int l = static_cast<int8_t>(nearest_int(iscale * scales[s]));  // ggml keeps it in an int8_t
      l = std::max(-32, std::min(31, l)) + 32;
      if (s < 8) {
        y->scales[s] = static_cast<uint8_t>(l & 0xF);
      } else {
        y->scales[s - 8] |= static_cast<uint8_t>((l & 0xF) << 4);
      }
      y->scales[s % 4 + 8] |= static_cast<uint8_t>((l >> 4) << (2 * (s / 4)));
    }
    y->d = f32_to_f16(1 / iscale);
  } else {
    y->d = f32_to_f16(0.f);
  }
  for (int s = 0; s < 16; ++s) {
    const float d = f16_to_f32(y->d) * (scale_q3_k(s, y->scales) - 32);
    if (!d) continue;
    for (int i = 0; i < 16; ++i) {
      const int l = nearest_int(x[16 * s + i] / d);
      L[16 * s + i] = static_cast<int8_t>(std::max(-4, std::min(3, l)) + 4);
    }
  }
  // Level bit 2 goes to hmask: value e at bit e / 32 of byte e % 32.
  std::memset(y->hmask, 0, sizeof(y->hmask));
  uint8_t low[kQKBlock];
  for (int e = 0; e < kQKBlock; ++e) {
    if (L[e] > 3) y->hmask[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
    low[e] = static_cast<uint8_t>(L[e] & 3);
  }
  pack_2bit_levels(low, y->qs);
}

// ggml's quantize_row_iq4_nl_impl for one IQ4_XS super-block without importance weights
// (weights x^2, 7 search steps each side): per 32 values the best scale for the code book
// around max / 127, then the 8 scales as 6-bit multiples of d = -max_scale / 32 and every
// value re-coded with its rounded scale.
void quantize_iq4_xs(const float* x, BlockIQ4_XS* y) {
  constexpr int kTries = 7;
  const int8_t* values = kIQ4NLValues;
  uint8_t L[kQKBlock];
  float scales[8];
  float weight[32];
  std::memset(y->qs, 0, sizeof(y->qs));
  y->d = f32_to_f16(0.f);
  float max_scale = 0, amax_scale = 0;
  for (int ib = 0; ib < 8; ++ib) {
    const float* xb = x + 32 * ib;
    uint8_t* Lb = L + 32 * ib;
    for (int j = 0; j < 32; ++j) weight[j] = xb[j] * xb[j];
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
      const float ax = std::fabs(xb[j]);
      if (ax > amax) {
        amax = ax;
        max = xb[j];
      }
    }
    if (amax < kGroupMaxEps) {
      scales[ib] = 0;
      continue;
    }
    float d = -max / values[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; ++j) {
      const int l = nearest_iq4nl_level(id * xb[j]);
      Lb[j] = static_cast<uint8_t>(l);
      const float q = values[l];
      const float w = weight[j];
      sumqx += w * q * xb[j];
      sumq2 += w * q * q;
    }
    d = sumqx / sumq2;
    float best = d * sumqx;
    for (int t = -kTries; t <= kTries; ++t) {
      id = (t + values[0]) / max;
      sumqx = sumq2 = 0;
      for (int j = 0; j < 32; ++j) {
        const float q = values[nearest_iq4nl_level(id * xb[j])];
        const float w = weight[j];
        sumqx += w * q * xb[j];
        sumq2 += w * q * q;
      }
      if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
        d = sumqx / sumq2;
        best = d * sumqx;
      }
    }
    scales[ib] = d;
    if (std::fabs(d) > amax_scale) {
      amax_scale = std::fabs(d);
      max_scale = d;
    }
  }
  y->scales_h = 0;
  const float d = -max_scale / 32;
  y->d = f32_to_f16(d);
  const float id = d ? 1 / d : 0.f;
  for (int ib = 0; ib < 8; ++ib) {
    int l = nearest_int(id * scales[ib]);
    l = std::max(-32, std::min(31, l));
    const float dl = d * l;
    const float idl = dl ? 1 / dl : 0.f;
    for (int j = 0; j < 32; ++j)
      L[32 * ib + j] = static_cast<uint8_t>(nearest_iq4nl_level(idl * x[32 * ib + j]));
    l += 32;
    if (ib % 2 == 0) {
      y->scales_l[ib / 2] = static_cast<uint8_t>(l & 0xF);
    } else {
      y->scales_l[ib / 2] |= static_cast<uint8_t>((l & 0xF) << 4);
    }
    y->scales_h = static_cast<uint16_t>(y->scales_h | ((l >> 4) << (2 * ib)));
  }
  for (int ib = 0; ib < 8; ++ib) {
    for (int j = 0; j < 16; ++j)
      y->qs[16 * ib + j] = static_cast<uint8_t>(L[32 * ib + j] | (L[32 * ib + 16 + j] << 4));
  }
}

template <class Block, class Fn>
void quantize_blocks(const float* src, void* dst, int64_t n, Fn quantize_block) {
  auto* blocks = static_cast<Block*>(dst);
  for (int64_t b = 0; b < n / kQKBlock; ++b) quantize_block(src + b * kQKBlock, &blocks[b]);
}

// Through the integer form: x = (d * scale) * q - dmin * min, in f32, ggml's order.
template <class Block, class Fn>
void dequantize_blocks(const void* src, float* dst, int64_t n, Fn decode_block) {
  const auto* blocks = static_cast<const Block*>(src);
  SuperBlockInts ints;
  for (int64_t b = 0; b < n / kQKBlock; ++b) {
    decode_block(blocks[b], &ints);
    float* y = dst + b * kQKBlock;
    for (int s = 0; s < 16; ++s) {
      const float scale = ints.d * ints.scales[s];
      const float min = ints.dmin * ints.mins[s];
      for (int j = 16 * s; j < 16 * s + 16; ++j) {
        y[j] = ints.mins[s] != 0 ? scale * ints.q[j] - min : scale * ints.q[j];
      }
    }
  }
}

}  // namespace

// 6-bit scale and min j (0..7) of a Q4_K / Q5_K block, from the 12 packed bytes:
//   j < 4:  scale = s[j] & 63,                         min = s[j + 4] & 63
//   j >= 4: scale = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4, min = (s[j + 4] >> 4) | (s[j] >> 6) <<
//   4
int scale_q3_k(int j, const uint8_t* s) {
  const int low = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
  const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return low | (high << 4);
}

void scale_min_k4(int j, const uint8_t* s, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void decode_super_block(DType dtype, const void* block, SuperBlockInts* out) {
  switch (dtype) {
    case DType::kQ2_K:
      return decode_q2_k(*static_cast<const BlockQ2_K*>(block), out);
    case DType::kQ3_K:
      return decode_q3_k(*static_cast<const BlockQ3_K*>(block), out);
    case DType::kQ4_K:
      return decode_q4_k(*static_cast<const BlockQ4_K*>(block), out);
    case DType::kQ5_K:
      return decode_q5_k(*static_cast<const BlockQ5_K*>(block), out);
    case DType::kQ6_K:
      return decode_q6_k(*static_cast<const BlockQ6_K*>(block), out);
    case DType::kIQ4_XS:
      return decode_iq4_xs(*static_cast<const BlockIQ4_XS*>(block), out);
    default:
      fail("{} is not a super-block type", to_string(dtype));
  }
}

void quantize_row_q8_k(const float* x, BlockQ8_K* y, int64_t n) {
  for (int64_t b = 0; b < n / kQKBlock; ++b, x += kQKBlock) {
    float max = 0;
    float amax = 0;
    for (int j = 0; j < kQKBlock; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    if (!amax) {
      std::memset(&y[b], 0, sizeof(y[b]));
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQKBlock; ++j)
      y[b].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    for (int s = 0; s < kQKBlock / 16; ++s) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += y[b].qs[16 * s + j];
      y[b].bsums[s] = static_cast<int16_t>(sum);
    }
    y[b].d = 1 / iscale;
  }
}

void quantize_row_q2_k(const float* src, void* dst, int64_t n) {
  quantize_blocks<BlockQ2_K>(src, dst, n, quantize_q2_k);
}
void quantize_row_q3_k(const float* src, void* dst, int64_t n) {
  quantize_blocks<BlockQ3_K>(src, dst, n, quantize_q3_k);
}
void quantize_row_q4_k(const float* src, void* dst, int64_t n) {
  quantize_blocks<BlockQ4_K>(src, dst, n, quantize_q4_k);
}
void quantize_row_q5_k(const float* src, void* dst, int64_t n) {
  quantize_blocks<BlockQ5_K>(src, dst, n, quantize_q5_k);
}
void quantize_row_q6_k(const float* src, void* dst, int64_t n) {
  quantize_blocks<BlockQ6_K>(src, dst, n, quantize_q6_k);
}
void quantize_row_iq4_xs(const float* src, void* dst, int64_t n) {
  quantize_blocks<BlockIQ4_XS>(src, dst, n, quantize_iq4_xs);
}

void dequantize_row_q2_k(const void* src, float* dst, int64_t n) {
  dequantize_blocks<BlockQ2_K>(src, dst, n, decode_q2_k);
}
void dequantize_row_q3_k(const void* src, float* dst, int64_t n) {
  dequantize_blocks<BlockQ3_K>(src, dst, n, decode_q3_k);
}
void dequantize_row_q4_k(const void* src, float* dst, int64_t n) {
  dequantize_blocks<BlockQ4_K>(src, dst, n, decode_q4_k);
}
void dequantize_row_q5_k(const void* src, float* dst, int64_t n) {
  dequantize_blocks<BlockQ5_K>(src, dst, n, decode_q5_k);
}
void dequantize_row_q6_k(const void* src, float* dst, int64_t n) {
  dequantize_blocks<BlockQ6_K>(src, dst, n, decode_q6_k);
}
void dequantize_row_iq4_xs(const void* src, float* dst, int64_t n) {
  dequantize_blocks<BlockIQ4_XS>(src, dst, n, decode_iq4_xs);
}

}  // namespace sieve::kernels::quant
