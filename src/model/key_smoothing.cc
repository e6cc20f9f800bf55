#include "model/key_smoothing.h"

#include "util/error.h"

namespace sieve::model {

KeySmoothing::KeySmoothing(kernels::Backend& backend, int64_t num_layers, int64_t kv_dim,
                           int64_t q_dim, std::span<const float> host)
    : kv_dim_(kv_dim), q_dim_(q_dim) {
  const auto floats = static_cast<size_t>(num_layers * (2 * kv_dim + q_dim));
  if (host.size() != floats)
    fail("key smoothing: {} values for {} layers, not {}", host.size(), num_layers, floats);
  buffer_ = backend.allocate(floats * sizeof(float));
  backend.upload(buffer_.data(), host.data(), floats * sizeof(float));
}

}  // namespace sieve::model
