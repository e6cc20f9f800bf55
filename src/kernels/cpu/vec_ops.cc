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

std::string_view vec_ops_target_name() { return HWY_DYNAMIC_DISPATCH(VecOpsTargetName)(); }

}  // namespace sieve::kernels
#endif  // HWY_ONCE
