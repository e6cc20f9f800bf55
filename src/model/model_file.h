#pragma once
// Writing model files: deterministic random-weight Llama GGUFs for tests and benchmarks, and
// conversion of a GGUF model between weight types.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <string>
#include <vector>

#include "gguf/gguf.h"
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

// A target of `sieve quantize`: one weight type for every matrix (Q8_0, Q4_0, Q6_K, ...) or
// one of llama.cpp's mixes (Q4_K_M, Q5_K_M, ...), where some matrices get more bits.
struct QuantMix {
  std::string_view name;  // as llama-quantize spells it: "Q4_K_M"
  kernels::DType base;    // the type of most matrices
  uint32_t file_type;     // llama.cpp's general.file_type (llama_ftype) for the mix
};
// Every target sieve knows, in llama_ftype order.
std::span<const QuantMix> quant_mixes();
// Case-insensitive; also llama-quantize's aliases Q3_K, Q4_K, Q5_K (= the _M mixes).
std::optional<QuantMix> parse_quant_mix(std::string_view name);

// What the per-tensor choice needs to know about the whole model.
struct QuantModelInfo {
  std::string architecture;  // general.architecture
  int64_t num_layers = 0;    // {arch}.block_count
  int64_t num_gqa = 1;       // query heads per KV head
  bool has_output = true;    // false: token_embd doubles as the output matrix (tied)
};
QuantModelInfo quant_model_info(const gguf::File& file);

struct PlannedType {
  kernels::DType dtype;
  std::string note;  // why the shape forced a fallback, if it did
};

// The type `sieve quantize` writes for one tensor. `shape` is ggml's (shape[0] = row length).
// Follows llama-quantize's llama_tensor_get_type (llama.cpp, src/llama-quant.cpp) for the
// dense architectures sieve runs:
//   - 1-D tensors (norms, biases, rope_freqs) are F32; F32/F16/BF16 targets convert every matrix.
//   - the output matrix (or token_embd when tied) is Q6_K, unless the mix is Q8_0 (stays Q8_0)
//     or its row length is not a multiple of the base type's block (Q8_0).
//   - token_embd otherwise gets the base type.
//   - attn_v: Q2_K -> Q4_K with >= 4 query heads per KV head (else Q3_K); Q3_K_M -> Q5_K in
//     the first 2 layers, else Q4_K; Q3_K_L -> Q5_K; IQ4_NL/IQ4_XS -> Q5_K with >= 4 query heads
//     per KV head; Q4_K_M/Q5_K_M -> Q6_K in "more bits" layers (the first and last eighth and
//     every third in between); Q4_K_S -> Q5_K in the first 4 layers; 70B Llama (80 layers,
//     GQA): Q3_K/Q4_K -> Q5_K.
//   - ffn_down: Q2_K -> Q3_K; Q3_K_M -> Q5_K in the first 16th, else Q4_K; Q3_K_L -> Q5_K;
//     Q4_K_M/Q5_K_M -> Q6_K in "more bits" layers; IQ4_NL/IQ4_XS -> Q5_K in the first eighth;
//     Q4_K_S -> Q5_K in the first eighth.
//   - attn_output: Q2_K -> Q3_K, Q3_K_M -> Q4_K, Q3_K_L -> Q5_K.
//   - attn_qkv (fused, Phi-3): Q3_K_M/Q3_K_L -> Q4_K, Q4_K_M -> Q5_K, Q5_K_M -> Q6_K.
//   - a row length that is not a multiple of the chosen type's block falls back as
//     llama-quantize does: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K/IQ4_XS -> IQ4_NL,
//     then F16 if still not a multiple (llama-quantize refuses the file there; sieve keeps F16).
// `pure` (llama-quantize --pure) skips the mix rules: every matrix gets the base type.
PlannedType plan_tensor_type(const QuantMix& mix, const QuantModelInfo& model,
                             std::string_view name, std::span<const uint64_t> shape,
                             bool pure = false);

struct QuantizeReport {
  struct Tensor {
    std::string name;
    std::string from_type;
    std::string to_type;
    std::string note;  // why a tensor kept a different type than the mix chose, if it did
  };
  std::vector<Tensor> tensors;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
};

// Writes `input` (a GGUF, or a Hugging Face folder read as one: model::open_model_file) as a GGUF
// file with the same keys, tensors and types.
void write_model_file(const gguf::File& input, const std::string& out_path);

// Converts every 2-D weight of a GGUF model (or a Hugging Face folder read as one:
// model::open_model_file) as plan_tensor_type() says, in memory: the returned File keeps the
// converted tensors and `input` (the tensors it did not convert are still its bytes). All
// metadata is kept; general.file_type becomes the mix's. Fails before converting anything when a
// planned type cannot be quantized by this build.
struct QuantizedFile {
  gguf::File file;
  QuantizeReport report;
};
QuantizedFile quantize_file(std::shared_ptr<const gguf::File> input, const QuantMix& mix,
                            ThreadPool& pool, bool pure = false);

// quantize_file() of `in_path`, written to `out_path` (`sieve quantize`).
QuantizeReport quantize_model(const std::string& in_path, const std::string& out_path,
                              const QuantMix& mix, ThreadPool& pool, bool pure = false);

std::optional<kernels::DType> parse_dtype(std::string_view name);  // "f32", "Q8_0", ...

}  // namespace sieve::model
