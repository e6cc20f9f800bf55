// Scalar reference matmul for the super-block weight types: see quant_super_blocks.h.
#include <vector>

#include "kernels/quant_super_blocks.h"

namespace sieve::kernels::ref {

void matmul_super_block(const MatrixView& w, const float* x, int64_t num_x, float* y) {
  const int64_t num_blocks = w.cols / kQKBlock;
  const size_t w_row_bytes = row_bytes(w.dtype, w.cols);
  const size_t w_block_bytes = block_bytes(w.dtype);
  std::vector<BlockQ8_K> xq(static_cast<size_t>(num_blocks));
  quant::SuperBlockInts wb;
  for (int64_t i = 0; i < num_x; ++i) {
    quant::quantize_row_q8_k(x + i * w.cols, xq.data(), w.cols);
    for (int64_t r = 0; r < w.rows; ++r) {
      const auto* row = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w_row_bytes;
      double sum = 0.0;
      for (int64_t b = 0; b < num_blocks; ++b) {
        quant::decode_super_block(w.dtype, row + b * w_block_bytes, &wb);
        const BlockQ8_K& xb = xq[b];
        int64_t sum_q = 0, sum_min = 0;
        for (int s = 0; s < kQKBlock / 16; ++s) {
          int32_t dot = 0;
          for (int j = 16 * s; j < 16 * s + 16; ++j) dot += wb.q[j] * xb.qs[j];
          sum_q += static_cast<int64_t>(wb.scales[s]) * dot;
          sum_min += static_cast<int64_t>(wb.mins[s]) * xb.bsums[s];
        }
        sum += static_cast<double>(wb.d) * xb.d * static_cast<double>(sum_q) -
               static_cast<double>(wb.dmin) * xb.d * static_cast<double>(sum_min);
      }
      y[i * w.rows + r] = static_cast<float>(sum);
    }
  }
}

}  // namespace sieve::kernels::ref
