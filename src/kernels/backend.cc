#include "kernels/backend.h"

#include "util/error.h"

namespace sieve::kernels {

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  if (options.device == "cpu") return make_cpu_backend(options.threads, options.prefill_dots);
  if (options.device == "reference") return make_reference_backend();
  fail("unknown device '{}' (devices: {})", options.device, kBackendDevices);
}

}  // namespace sieve::kernels
