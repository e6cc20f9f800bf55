#pragma once
// What llama.cc (the layers) and llama_attention.cc (their attention and observation passes)
// share; not part of the model's interface.
#include <algorithm>
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/paged_attention.h"
#include "model/kv_cache.h"

namespace sieve::model::detail {

// Grows `buffer` (backend memory) to hold at least `floats` floats; its contents are scratch.
inline float* grow(kernels::Backend& backend, kernels::DeviceBuffer& buffer, int64_t floats) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(floats, 1)) * sizeof(float);
  if (buffer.bytes() < bytes) buffer = backend.allocate(std::max(bytes, buffer.bytes() * 3 / 2));
  return buffer.as<float>();
}

// Block-quantized (q8 / q4) caches hold smoothed, rotated keys (llama.cc): their queries are
// smoothed and rotated alike.
inline bool rotates_keys(const KvCache& cache) { return kernels::is_block_kv_dtype(cache.dtype()); }

}  // namespace sieve::model::detail
