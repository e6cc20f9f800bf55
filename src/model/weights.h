#pragma once
// The tensors of a Llama-family decoder. Matrices are row-major [out][in] views (MatrixView),
// either straight into the memory-mapped GGUF file (no copy) or into buffers this object owns
// (llama2.c checkpoints). Norm vectors are always converted to f32.
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/ops.h"
#include "model/config.h"

namespace sieve::model {

// The kernels' dtype for a GGUF tensor type (nullopt: sieve cannot compute with it), and back.
std::optional<kernels::DType> to_dtype(gguf::TensorType type);
gguf::TensorType to_tensor_type(kernels::DType dtype);

struct LayerWeights {
  std::vector<float> attn_norm;  // [dim]
  kernels::MatrixView wq;        // [q_dim][dim]
  kernels::MatrixView wk;        // [kv_dim][dim]
  kernels::MatrixView wv;        // [kv_dim][dim]
  kernels::MatrixView wo;        // [dim][q_dim]
  std::vector<float> ffn_norm;   // [dim]
  kernels::MatrixView w_gate;    // [ffn_dim][dim]
  kernels::MatrixView w_up;      // [ffn_dim][dim]
  kernels::MatrixView w_down;    // [dim][ffn_dim]
};

struct Weights {
  kernels::MatrixView token_embd;  // [vocab][dim]
  std::vector<LayerWeights> layers;
  std::vector<float> output_norm;  // [dim]
  kernels::MatrixView output;      // [vocab][dim]; the same view as token_embd when tied
  bool tied_output = false;

  // Bytes of weights read to compute one token's logits (every matrix but the embedding
  // table, of which only one row is read). The bandwidth benchmark divides by this.
  size_t bytes_per_token() const;

  // Keeps whatever backs the views alive (a mapped file, owned buffers).
  std::shared_ptr<const void> storage;
};

// Views the tensors of a GGUF file. `file` must outlive the returned Weights (keep the
// shared_ptr). Shapes are checked against config; tensors of types sieve cannot compute with
// are rejected naming the tensor and its type. Reads rope_freqs into config.
Weights weights_from_gguf(std::shared_ptr<const gguf::File> file, ModelConfig& config);

struct Llama2cModel {
  ModelConfig config;
  Weights weights;
};
// Reads a llama2.c checkpoint: 7 int32 header fields (dim, hidden_dim, n_layers, n_heads,
// n_kv_heads, vocab_size — negative when the classifier is not shared — and seq_len), then
// f32 weights in llama2.c order.
Llama2cModel load_llama2c_checkpoint(const std::string& path);

}  // namespace sieve::model
