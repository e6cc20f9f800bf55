// Scalar (de)quantization of the ggml super blocks types: see quant_formats.h.
#include "kernels/quant_formats.h"

#include "util/error.h"

namespace sieve::kernels::quant {

void quantize_row_super_block(DType dtype, const float* src, void* dst, int64_t n) {
  fail("quantizing to {} is not implemented yet", to_string(dtype));
}

void dequantize_row_super_block(DType dtype, const void* src, float* dst, int64_t n) {
  fail("dequantizing {} is not implemented yet", to_string(dtype));
}

}  // namespace sieve::kernels::quant
