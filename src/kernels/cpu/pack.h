#pragma once
// The CPU backend's packed weights: a repacking of a weight matrix made once at load
// (CpuBackend::prepare_weights) that its matmul reads instead of the ggml bytes. The packed copy
// is the backend's handle for the matrix: MatrixView::prepared points at its bytes, and nothing
// outside cpu/ (and its tests) looks inside.
//
// Weights are repacked for matmul on x86 CPUs with AVX-512, where packed_matmul_supported(dtype):
// F16 and BF16 as cpu/matmul_float_avx512.h's packed groups (64 rows, column by column, the same
// size rounded up to 64 rows: one sequential stream per thread in decode, and each output's sums
// in column order whatever the batch); with VNNI, the quantized types:
// Q8_0, the 32-value blocks Q4_0, Q4_1, Q5_0, Q5_1 and
// IQ4_NL, Q4_K, Q5_K and Q6_K. Groups of 16 rows (the last one padded with zero rows), and per
// group and block the 16 rows' scales side by side, then their values interleaved so that one
// 64-byte load holds 4 columns of all 16 rows (one int32 lane per row), the operand of vpdpbusd
// against 4 broadcast activation bytes: matmul needs no horizontal sums and decodes each weight
// once for up to 8 activation rows. Q8_0, per block 544 bytes:
//   16 f16 scales (row order), then for k = 0..7, for row r = 0..15: the 4 bytes of columns
//   4k..4k+3 of row r, each as w + 128 (u8);
// the 32-value blocks as cpu/matmul_vnni_small_blocks.h's packed_block_bytes() (nibbles stay
// packed), the same size as the blocks, rounded up to 16 rows; Q4_K as
// cpu/matmul_super_blocks_vnni.h's kPackedQ4_KBytes, 2.8% more (scales and mins as bytes), Q5_K
// as its kPackedQ5_KBytes (+2.3%), Q6_K as its kPackedQ6_KBytes (+1%).
//
// The bytes start on a cache line: the packed tiles load whole 64-byte lines, and from the 16
// bytes past one that malloc gives, every load spans two (kernels_bench: L3-resident packed
// decode 20-40% slower). Copies of 2 MiB or more start on a 2 MiB boundary and ask for
// transparent huge pages (madvise), so that decode, which streams all of them every token, does
// not walk the page tables every 4 KiB.
// The bytes come from allocate_packed() (ops.h): they start on a cache line, and on a 2 MiB
// boundary from 2 MiB on, with transparent huge pages asked for.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/ops.h"

namespace sieve::kernels {

template <class T>
struct PackedAllocator {
  using value_type = T;
  PackedAllocator() = default;
  template <class U>
  PackedAllocator(const PackedAllocator<U>&) {}  // NOLINT: rebinding, as std::allocator
  T* allocate(size_t n) { return static_cast<T*>(allocate_packed(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { free_packed(p, n * sizeof(T)); }
  friend bool operator==(const PackedAllocator&, const PackedAllocator&) { return true; }
};
using PackedBytes = std::vector<uint8_t, PackedAllocator<uint8_t>>;
bool packed_matmul_supported(DType dtype);
// Where packed_matmul_supported(w.dtype); on `pool`'s threads when given (load time: ~0.2 s per
// 250 MB of weights on one thread here).
PackedBytes pack_for_matmul(const MatrixView& w, ThreadPool* pool = nullptr);

// The packed bytes a CPU-prepared view carries, or null (not packed, or prepared elsewhere).
inline const uint8_t* packed_bytes(const MatrixView& w) {
  return reinterpret_cast<const uint8_t*>(w.prepared);
}
// Makes `w` carry `packed` (which must outlive every use of w) as its prepared form.
inline void attach_packed(MatrixView& w, const PackedBytes& packed) {
  w.prepared = reinterpret_cast<const PreparedMatrix*>(packed.data());
}

}  // namespace sieve::kernels
