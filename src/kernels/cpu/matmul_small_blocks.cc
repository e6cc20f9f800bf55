// matmul() for Q4_1, Q5_0, Q5_1, IQ4_NL weights (see matmul_quant_types.h): matmul-inl.h's
// QuantKernel with one Row policy per type, compiled once per Highway target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/matmul_small_blocks.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/matmul-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sieve::kernels::HWY_NAMESPACE {

void MatmulQ4_1(const MatrixView& w, const float* x, int64_t num_x, float* y, ThreadPool& pool) {
  MatmulQuant<Q4_1Row>(w, x, num_x, y, pool);
}
void MatmulQ5_0(const MatrixView& w, const float* x, int64_t num_x, float* y, ThreadPool& pool) {
  MatmulQuant<Q5_0Row>(w, x, num_x, y, pool);
}
void MatmulQ5_1(const MatrixView& w, const float* x, int64_t num_x, float* y, ThreadPool& pool) {
  MatmulQuant<Q5_1Row>(w, x, num_x, y, pool);
}
void MatmulIQ4_NL(const MatrixView& w, const float* x, int64_t num_x, float* y, ThreadPool& pool) {
  MatmulQuant<IQ4_NLRow>(w, x, num_x, y, pool);
}

}  // namespace sieve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/matmul_quant_types.h"
#include "util/error.h"

namespace sieve::kernels {

HWY_EXPORT(MatmulQ4_1);
HWY_EXPORT(MatmulQ5_0);
HWY_EXPORT(MatmulQ5_1);
HWY_EXPORT(MatmulIQ4_NL);

void matmul_small_block(const MatrixView& w, const float* x, int64_t num_x, float* y,
                        ThreadPool& pool) {
  switch (w.dtype) {
    case DType::kQ4_1:
      return HWY_DYNAMIC_DISPATCH(MatmulQ4_1)(w, x, num_x, y, pool);
    case DType::kQ5_0:
      return HWY_DYNAMIC_DISPATCH(MatmulQ5_0)(w, x, num_x, y, pool);
    case DType::kQ5_1:
      return HWY_DYNAMIC_DISPATCH(MatmulQ5_1)(w, x, num_x, y, pool);
    case DType::kIQ4_NL:
      return HWY_DYNAMIC_DISPATCH(MatmulIQ4_NL)(w, x, num_x, y, pool);
    default:
      fail("matmul_small_block: {} is not a ggml block-of-32 type", to_string(w.dtype));
  }
}

}  // namespace sieve::kernels
#endif  // HWY_ONCE
