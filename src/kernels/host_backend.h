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
};

// Plain loops, shared by both host backends (the CPU one runs them on row ranges in parallel).
namespace host_rows {

inline void copy_rows_2d(Rows<const float> src, Rows<float> dst, int64_t begin, int64_t end,
                         int64_t n) {
  for (int64_t r = begin; r < end; ++r)
    std::memmove(dst.row(r), src.row(r), static_cast<size_t>(n) * sizeof(float));
}

inline void check_kv_dtype(DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kF16)
    fail("KV storage must be f32 or f16 (got {})", to_string(dtype));
}

// Rows [begin, end) of Backend::store_kv_rows; dtype checked by check_kv_dtype.
inline void store_kv_rows(Rows<const float> src, int64_t head_dim, DType dtype, void* dst,
                          const int64_t* dst_offsets, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const float* row = src.row(r);
    if (dtype == DType::kF16) {
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
