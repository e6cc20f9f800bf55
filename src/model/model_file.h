#pragma once
// Writing model files: deterministic random-weight Llama GGUFs for tests and benchmarks, and
// conversion of a GGUF model between weight types.
#include <cstdint>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace sieve {
class ThreadPool;
}

namespace sieve::model {

struct RandomModelSpec {
  int64_t dim = 512;
  int64_t num_layers = 8;
  int64_t num_heads = 8;
  int64_t num_kv_heads = 2;
  int64_t ffn_dim = 1408;
  int64_t context_length = 32768;
  float rope_base = 500000.0f;
  kernels::DType dtype = kernels::DType::kF16;
  std::string vocab_path;  // GGUF whose tokenizer.* keys (and so vocabulary size) are copied
  uint64_t seed = 1;
};

// Writes a Llama GGUF whose weights are uniform random with per-matrix scales chosen so that
// activations stay at unit scale through the layers and the logits have a standard deviation
// of about 4 (top tokens are separated by far more than rounding error). The same spec
// always gives the same bytes, whatever the thread count.
void write_random_model(const RandomModelSpec& spec, const std::string& out_path, ThreadPool& pool);

struct QuantizeReport {
  struct Tensor {
    std::string name;
    std::string from_type;
    std::string to_type;
    std::string note;  // why a tensor kept a different type than requested, if it did
  };
  std::vector<Tensor> tensors;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
};

// Converts every 2-D weight of a GGUF model to `dtype` (1-D tensors stay F32). Rows whose
// length is not a multiple of the block size (e.g. 172 for Q8_0) fall back to F16. All
// metadata is copied; general.file_type is updated.
QuantizeReport quantize_model(const std::string& in_path, const std::string& out_path,
                              kernels::DType dtype, ThreadPool& pool);

std::optional<kernels::DType> parse_dtype(std::string_view name);  // "f32", "Q8_0", ...

}  // namespace sieve::model
