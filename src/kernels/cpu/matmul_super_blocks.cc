// matmul() for the super blocks weight types: see matmul_quant_types.h.
#include "kernels/cpu/matmul_quant_types.h"

#include "util/error.h"

namespace sieve::kernels {

void matmul_super_block(const MatrixView& w, const float* x, int64_t num_x, float* y, ThreadPool& pool) {
  fail("matmul with {} weights is not implemented yet", to_string(w.dtype));
}

}  // namespace sieve::kernels
