// Vector ops: per-target entry points (compiled once per Highway target) and dispatchers.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/vec_ops.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/ops-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sieve::kernels::HWY_NAMESPACE {

float DotImpl(const float* a, const float* b, int64_t n) { return Dot(a, b, n); }
void AxpyImpl(float alpha, const float* x, float* y, int64_t n) { Axpy(alpha, x, y, n); }
void RmsNormImpl(const float* x, const float* weight, float eps, float* out, int64_t n) {
  RmsNorm(x, weight, eps, out, n);
}
void SiluMulImpl(float* gate, const float* up, int64_t n) { SiluMul(gate, up, n); }
float SoftmaxImpl(float* x, int64_t n) { return Softmax(x, n); }
void RotateHeadsImpl(float* x, int64_t num_heads, int64_t head_dim) {
  for (int64_t h = 0; h < num_heads; ++h) RotateHead(x + h * head_dim, head_dim);
}
uint64_t SumWordsImpl(const uint64_t* words, int64_t n) {
  const hn::ScalableTag<uint64_t> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  constexpr int64_t kPrefetchBytes = 2048;  // 1-4 KiB ahead measured alike (+7-10%)
  auto s0 = hn::Zero(d), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    const char* ahead = reinterpret_cast<const char*>(words + i) + kPrefetchBytes;
    for (int64_t line = 0; line < 4 * lanes * 8; line += 64) __builtin_prefetch(ahead + line, 0, 2);
    s0 = hn::Add(s0, hn::LoadU(d, words + i));
    s1 = hn::Add(s1, hn::LoadU(d, words + i + lanes));
    s2 = hn::Add(s2, hn::LoadU(d, words + i + 2 * lanes));
    s3 = hn::Add(s3, hn::LoadU(d, words + i + 3 * lanes));
  }
  uint64_t sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < n; ++i) sum += words[i];
  return sum;
}
// 12 independent chains of acc = acc * b + c (chain i starts at i / 1024 in every lane): enough
// chains to cover the FMA's latency on both of a core's FMA pipes. Returns the lane-0 sum of the
// chains (in chain order) so the work cannot be dropped; *flops gets 2 x lanes x 12 x iterations.
float FmaChainsImpl(int64_t iterations, double* flops) {
  const hn::ScalableTag<float> d;
  constexpr int kChains = 12;
  const auto b = hn::Set(d, 0.9999f), c = hn::Set(d, 1e-6f);
  hn::Vec<decltype(d)> acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = hn::Set(d, static_cast<float>(i) / 1024);
  for (int64_t k = 0; k < iterations; ++k) {
#pragma GCC unroll 12  // every chain in its own register
    for (int i = 0; i < kChains; ++i) acc[i] = hn::MulAdd(acc[i], b, c);
  }
  *flops = 2.0 * static_cast<double>(hn::Lanes(d)) * kChains * static_cast<double>(iterations);
  auto sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = hn::Add(sum, acc[i]);
  return hn::GetLane(sum);
}
const char* VecOpsTargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace sieve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cassert>

#include "kernels/cpu/targets.h"
#include "kernels/ops.h"

namespace sieve::kernels {

HWY_EXPORT(DotImpl);
HWY_EXPORT(AxpyImpl);
HWY_EXPORT(RmsNormImpl);
HWY_EXPORT(SiluMulImpl);
HWY_EXPORT(SoftmaxImpl);
HWY_EXPORT(RotateHeadsImpl);
HWY_EXPORT(SumWordsImpl);
HWY_EXPORT(FmaChainsImpl);
HWY_EXPORT(VecOpsTargetName);

float dot(const float* a, const float* b, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(DotImpl)(a, b, n);
}
void axpy(float alpha, const float* x, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AxpyImpl)(alpha, x, y, n);
}
void rmsnorm(const float* x, const float* weight, float eps, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(RmsNormImpl)(x, weight, eps, out, n);
}
void silu_mul(float* gate, const float* up, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SiluMulImpl)(gate, up, n);
}
float softmax(float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(SoftmaxImpl)(x, n); }
void rotate_heads(float* x, int64_t num_rows, int64_t num_heads, int64_t head_dim) {
  assert(head_dim > 0 && (head_dim & (head_dim - 1)) == 0);
  HWY_DYNAMIC_DISPATCH(RotateHeadsImpl)(x, num_rows * num_heads, head_dim);
}

float fma_chains(int64_t iterations, double* flops) {
  return HWY_DYNAMIC_DISPATCH(FmaChainsImpl)(iterations, flops);
}
uint64_t sum_words(const uint64_t* words, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(SumWordsImpl)(words, n);
}

std::string_view vec_ops_target_name() { return HWY_DYNAMIC_DISPATCH(VecOpsTargetName)(); }

}  // namespace sieve::kernels
#endif  // HWY_ONCE
