// libFuzzer target for the GGUF reader (and, on inputs it accepts, the writer and model
// loading: configuration and weights).
//
// Properties checked, beyond "no crash, no sanitizer report":
//   - File::parse either succeeds or throws sieve::Error; nothing else escapes.
//   - On success every getter either answers or throws FormatError, and every tensor's bytes
//     are readable.
//   - Writing an accepted file back out succeeds, the result parses, and writing that again
//     gives the same bytes (the writer's output is a fixed point).
//   - Loading a model from an accepted file (config_from_gguf, then weights_from_gguf) either
//     succeeds, with every matrix view inside the file, or throws sieve::Error: an unsupported
//     tensor type, architecture or shape is refused at load, never later.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/weights.h"

namespace {

using sieve::gguf::File;
using sieve::gguf::FormatError;
using sieve::gguf::Writer;

// Keeps the round trip cheap: a huge alignment would make the writer pad gigabytes.
constexpr uint64_t kMaxRoundTripAlignment = 4096;
constexpr uint64_t kMaxRoundTripTensorBytes = uint64_t{1} << 24;

template <typename Get>
void try_get(Get&& get) {
  try {
    get();
  } catch (const FormatError&) {
  }
}

void exercise_getters(const File& file) {
  for (const auto& kv : file.metadata()) {
    if (file.find(kv.key) != &kv.value) __builtin_trap();
    try_get([&] { file.get_string(kv.key); });
    try_get([&] { file.get_u64(kv.key); });
    try_get([&] { file.get_i64(kv.key); });
    try_get([&] { file.get_f64(kv.key); });
    try_get([&] { file.get_bool(kv.key); });
    try_get([&] { file.get_string_array(kv.key); });
    try_get([&] { file.get_f32_array(kv.key); });
    try_get([&] { file.get_i32_array(kv.key); });
  }
}

// Returns the total tensor bytes.
uint64_t exercise_tensors(const File& file) {
  uint64_t total = 0;
  for (const auto& tensor : file.tensors()) {
    if (file.find_tensor(tensor.name) != &tensor) __builtin_trap();
    const std::span<const uint8_t> data = file.tensor_data(tensor);
    if (data.size() != tensor.num_bytes) __builtin_trap();
    if (!data.empty()) {
      volatile uint8_t edge = data.front() ^ data.back();  // ASan checks both ends
      (void)edge;
    }
    (void)sieve::gguf::to_string(tensor.type);
    (void)sieve::gguf::is_supported(tensor.type);
    (void)tensor.num_elements();
    total += tensor.num_bytes;
  }
  return total;
}

Writer rewrite(const File& file) {
  Writer writer;
  for (const auto& kv : file.metadata()) writer.copy_from(file, kv.key);
  for (const auto& tensor : file.tensors()) {
    const std::span<const uint8_t> data = file.tensor_data(tensor);
    writer.add_tensor(tensor.name, tensor.type, tensor.shape, {data.begin(), data.end()});
  }
  return writer;
}

// A matrix view must lie inside the file's bytes, with a type the kernels compute with.
void check_view(const sieve::kernels::MatrixView& view, std::span<const uint8_t> bytes) {
  if (view.data == nullptr) return;  // e.g. no separate output matrix
  const auto* begin = static_cast<const uint8_t*>(view.data);
  const size_t size =
      sieve::kernels::row_bytes(view.dtype, view.cols) * static_cast<size_t>(view.rows);
  if (begin < bytes.data() || begin + size > bytes.data() + bytes.size()) __builtin_trap();
}

// What `sieve run` / `sieve serve` do at load, minus the tokenizer (fuzzed on its own) and the
// KV cache: every failure must be a sieve::Error.
void load_model(std::shared_ptr<const File> file, std::span<const uint8_t> bytes) {
  try {
    sieve::model::ModelConfig config = sieve::model::config_from_gguf(*file);
    const sieve::model::Weights weights = sieve::model::weights_from_gguf(file, config);
    check_view(weights.token_embd, bytes);
    check_view(weights.output, bytes);
    for (const auto& layer : weights.layers) {
      for (const auto* view : {&layer.wq, &layer.wk, &layer.wv, &layer.wo, &layer.w_gate,
                               &layer.w_up, &layer.w_down}) {
        check_view(*view, bytes);
      }
    }
  } catch (const sieve::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<File> file;
  try {
    file.emplace(File::parse({data, size}));
  } catch (const sieve::Error&) {
    return 0;
  }
  exercise_getters(*file);
  const uint64_t tensor_bytes = exercise_tensors(*file);
  // Views of a parsed (not opened) file point into the fuzzer's buffer.
  const auto shared_file = std::make_shared<const File>(File::parse({data, size}));
  load_model(shared_file, {data, size});

  if (file->alignment() > kMaxRoundTripAlignment || tensor_bytes > kMaxRoundTripTensorBytes) {
    return 0;
  }
  // Anything the reader accepts, the writer must write, and the reader must accept that.
  const std::vector<uint8_t> first = rewrite(*file).to_bytes();
  const File reread = File::parse(first);
  if (reread.metadata().size() != file->metadata().size() ||
      reread.tensors().size() != file->tensors().size()) {
    __builtin_trap();
  }
  if (rewrite(reread).to_bytes() != first) __builtin_trap();
  return 0;
}
