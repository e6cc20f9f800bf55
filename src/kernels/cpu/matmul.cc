// matmul(): per-target entry points (compiled once per Highway target) and the dispatcher.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/matmul.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/matmul-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sieve::kernels::HWY_NAMESPACE {

void MatmulF32(const MatrixView& w, const float* x, int64_t num_x, float* y, ThreadPool& pool) {
  MatmulFloat<F32Row>(w, x, num_x, y, pool);
}
void MatmulF16(const MatrixView& w, const float* x, int64_t num_x, float* y, ThreadPool& pool) {
  MatmulFloat<F16Row>(w, x, num_x, y, pool);
}
void MatmulBF16(const MatrixView& w, const float* x, int64_t num_x, float* y, ThreadPool& pool) {
  MatmulFloat<BF16Row>(w, x, num_x, y, pool);
}
void MatmulQ8_0(const MatrixView& w, const float* x, int64_t num_x, float* y, ThreadPool& pool) {
  MatmulQuant<Q8_0Row>(w, x, num_x, y, pool);
}
void MatmulQ4_0(const MatrixView& w, const float* x, int64_t num_x, float* y, ThreadPool& pool) {
  MatmulQuant<Q4_0Row>(w, x, num_x, y, pool);
}
const char* MatmulTargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace sieve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/matmul_quant_types.h"
#include "kernels/cpu/targets.h"

namespace sieve::kernels {

HWY_EXPORT(MatmulF32);
HWY_EXPORT(MatmulF16);
HWY_EXPORT(MatmulBF16);
HWY_EXPORT(MatmulQ8_0);
HWY_EXPORT(MatmulQ4_0);
HWY_EXPORT(MatmulTargetName);

void matmul(const MatrixView& w, const float* x, int64_t num_x, float* y, ThreadPool& pool) {
  switch (w.dtype) {
    case DType::kF32:
      return HWY_DYNAMIC_DISPATCH(MatmulF32)(w, x, num_x, y, pool);
    case DType::kF16:
      return HWY_DYNAMIC_DISPATCH(MatmulF16)(w, x, num_x, y, pool);
    case DType::kBF16:
      return HWY_DYNAMIC_DISPATCH(MatmulBF16)(w, x, num_x, y, pool);
    case DType::kQ8_0:
      return HWY_DYNAMIC_DISPATCH(MatmulQ8_0)(w, x, num_x, y, pool);
    case DType::kQ4_0:
      return HWY_DYNAMIC_DISPATCH(MatmulQ4_0)(w, x, num_x, y, pool);
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kIQ4_NL:
      return matmul_small_block(w, x, num_x, y, pool);
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kIQ4_XS:
      return matmul_super_block(w, x, num_x, y, pool);
  }
}

std::string_view matmul_target_name() { return HWY_DYNAMIC_DISPATCH(MatmulTargetName)(); }

}  // namespace sieve::kernels
#endif  // HWY_ONCE
