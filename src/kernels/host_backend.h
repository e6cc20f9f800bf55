#pragma once
// Internal to src/kernels: the memory half of a Backend whose device memory is host memory (the
// CPU and reference backends), and the plain-loop forms of the small row ops both can share.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#include "kernels/backend.h"
#include "util/error.h"

namespace sieve::kernels {

class HostMemoryBackend : public Backend {
 public:
  static constexpr std::align_val_t kAlignment{64};  // a cache line; every SIMD width we build

  DeviceBuffer allocate(size_t bytes) final {
    if (bytes == 0) return {};
    void* data = ::operator new(bytes, kAlignment);
    std::memset(data, 0, bytes);
    return wrap_buffer(data, bytes, [](void* p) { ::operator delete(p, kAlignment); });
  }
  void upload(void* dst, const void* src, size_t bytes) final { copy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) final { copy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) final {
    if (bytes > 0) std::memmove(dst, src, bytes);
  }
  void fill_zero(void* dst, size_t bytes) final {
    if (bytes > 0) std::memset(dst, 0, bytes);
  }
  // A plain copy out of host memory, one row at a time; both host backends share it.
  void gather_keys(const PagedKv& kv, int64_t num_keys, float* out) final {
    for (int64_t h = 0; h < kv.num_kv_heads; ++h) {
      for (int64_t t = 0; t < num_keys; ++t) {
        load_kv_row(kv, /*value=*/false, t, h, out + (h * num_keys + t) * kv.head_dim);
      }
    }
  }
};

// Plain loops, shared by both host backends (the CPU one runs them on row ranges in parallel).
namespace host_rows {

inline void copy_rows_2d(Rows<const float> src, Rows<float> dst, int64_t begin, int64_t end,
                         int64_t n) {
  for (int64_t r = begin; r < end; ++r)
    std::memmove(dst.row(r), src.row(r), static_cast<size_t>(n) * sizeof(float));
}

inline void check_kv_dtype(DType dtype, int64_t head_dim) {
  if (!is_kv_dtype(dtype))
    fail("KV storage must be F32, F16, Q8_0 or Q4_1 (got {})", to_string(dtype));
  if (is_block_kv_dtype(dtype) && head_dim % block_elems(dtype) != 0)
    fail("{} KV storage needs a head_dim that is a multiple of {} (got {}); use f16 or f32",
         to_string(dtype), block_elems(dtype), head_dim);
}

// Rows [begin, end) of Backend::store_kv_rows; dtype checked by check_kv_dtype.
inline void store_kv_rows(Rows<const float> src, int64_t head_dim, DType dtype, void* dst,
                          const int64_t* dst_offsets, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const float* row = src.row(r);
    if (is_block_kv_dtype(dtype)) {  // element offset o at byte row_bytes(dtype, o)
      quantize_row(dtype, row, static_cast<uint8_t*>(dst) + row_bytes(dtype, dst_offsets[r]),
                   head_dim);
    } else if (dtype == DType::kF16) {
      uint16_t* out = static_cast<uint16_t*>(dst) + dst_offsets[r];
      for (int64_t d = 0; d < head_dim; ++d) out[d] = f32_to_f16(row[d]);
    } else {
      std::memcpy(static_cast<float*>(dst) + dst_offsets[r], row,
                  static_cast<size_t>(head_dim) * sizeof(float));
    }
  }
}

}  // namespace host_rows

}  // namespace sieve::kernels
