// libFuzzer target for the safetensors reader (src/hf/safetensors.h).
//
// Properties checked, beyond "no crash, no sanitizer report":
//   - SafetensorsFile::parse either succeeds or throws sieve::Error; nothing else escapes.
//   - On success the tensors tile the data: every tensor's bytes lie inside the input, in order,
//     without overlap, and each holds exactly its shape's elements of its dtype.
#include <cstddef>
#include <cstdint>
#include <optional>

#include "hf/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<sieve::hf::SafetensorsFile> file;
  try {
    file.emplace(sieve::hf::SafetensorsFile::parse({data, size}, "fuzz"));
  } catch (const sieve::Error&) {
    return 0;
  }
  const uint8_t* previous_end = nullptr;
  for (const sieve::hf::TensorInfo& tensor : file->tensors()) {
    const std::span<const uint8_t> bytes = file->data(tensor);
    if (bytes.data() < data || bytes.data() + bytes.size() > data + size) __builtin_trap();
    if (previous_end != nullptr && bytes.data() != previous_end) __builtin_trap();
    if (bytes.size() != tensor.num_elements() * sieve::hf::dtype_size(tensor.dtype))
      __builtin_trap();
    if (file->find(tensor.name) != &tensor) __builtin_trap();
    if (!bytes.empty()) {
      volatile uint8_t edge = bytes.front() ^ bytes.back();  // ASan checks both ends
      (void)edge;
    }
    previous_end = bytes.data() + bytes.size();
  }
  return 0;
}
