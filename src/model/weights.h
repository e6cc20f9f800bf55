#pragma once
// The tensors of a Llama-family decoder. Matrices are row-major [out][in] views (MatrixView),
// either straight into the memory-mapped GGUF file (no copy) or into buffers this object owns
// (llama2.c checkpoints). Norm vectors are always converted to f32.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/ops.h"
#include "model/config.h"

namespace sieve::model {

// The kernels' dtype for a GGUF tensor type (nullopt: sieve cannot compute with it), and back.
std::optional<kernels::DType> to_dtype(gguf::TensorType type);
gguf::TensorType to_tensor_type(kernels::DType dtype);

// One layer. Which optional parts are present comes from the architecture (architecture.h)
// and the file; the forward pass reads only this struct.
struct LayerWeights {
  std::vector<float> attn_norm;  // [dim]
  // Attention input: wq, wk, wv, or (fused) wqkv alone, one matmul whose output rows are split.
  kernels::MatrixView wq;                   // [q_dim][dim]
  kernels::MatrixView wk;                   // [kv_dim][dim]
  kernels::MatrixView wv;                   // [kv_dim][dim]
  std::optional<kernels::MatrixView> wqkv;  // [q_dim + 2 kv_dim][dim], rows Q, K, V; wq/wk/wv unset
  std::vector<float> bq, bk, bv;            // [q_dim], [kv_dim], [kv_dim]; empty: no bias
  std::vector<float> q_norm,
      k_norm;                   // [head_dim]: RMSNorm of each Q/K head before RoPE; empty: none
  kernels::MatrixView wo;       // [dim][q_dim]
  std::vector<float> ffn_norm;  // [dim]
  kernels::MatrixView w_gate;   // [ffn_dim][dim]
  kernels::MatrixView w_up;     // [ffn_dim][dim]
  std::optional<kernels::MatrixView>
      w_gate_up;               // [2 ffn_dim][dim], rows gate then up; w_gate/w_up unset
  kernels::MatrixView w_down;  // [dim][ffn_dim]

  // The matrices the forward pass multiplies by (the fused ones in place of their parts).
  std::vector<kernels::MatrixView*> matrices();
  std::vector<const kernels::MatrixView*> matrices() const;
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

// Views the tensors of a GGUF file, named and shaped as config's architecture describes
// (architecture.h). `file` must outlive the returned Weights (keep the shared_ptr). Shapes are
// checked against config; tensors of types sieve cannot compute with are rejected naming the
// tensor and its type, and so are tensors sieve would not use (an unsupported variant of the
// architecture). Reads rope_freqs into config.
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
