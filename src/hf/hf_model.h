#pragma once
// A Hugging Face model folder (config.json + safetensors weights) seen as the GGUF file
// llama.cpp's converter (convert_hf_to_gguf.py) would make of it: the same general.* and
// <arch>.* keys, the same tensor names, Q/K rows permuted where the converter permutes them.
// Everything above reads it as any other GGUF (model/config.cc builds ModelConfig from the
// keys, model/weights.cc the Weights from the tensors: one mapping to sieve's description), and
// `sieve convert` writes it out as is.
//
//   config.json "architectures"  general.architecture  Q/K rows    notes
//   LlamaForCausalLM             llama                 permuted    rope_scaling llama3 ->
//   rope_freqs MistralForCausalLM           llama                 permuted    sliding_window kept
//   Qwen2ForCausalLM             qwen2                 as stored   q/k/v biases
//   Qwen3ForCausalLM             qwen3                 as stored   q_norm, k_norm; head_dim
//   Phi3ForCausalLM              phi3                  as stored   qkv_proj, gate_up_proj stay
//                                                                  fused (attn_qkv, ffn_up)
//
// Why Q/K are permuted for llama: HF's Llama rotates the pairs (i, i + d/2) of each head
// (rotate_half), GGUF's llama rotates (2i, 2i + 1) ("normal" RoPE). Reordering each head's rows
// so that row 2i is HF's row i and row 2i + 1 is HF's row i + d/2 makes the normal rotation
// the same rotation, and permutes Q and K alike so their dot products are unchanged (up to
// summation order). Permuting (rather than running NEOX RoPE on HF's order) gives the GGUF the
// converter writes, so a folder and its conversion give bitwise equal logits; it costs a copy
// of Q and K. qwen2, qwen3 and phi3 run NEOX RoPE, which is HF's rotation: no permutation.
//
// Weights stay in the safetensors mappings (F32, F16 and BF16 matrices as stored); permuted
// Q/K matrices and the 1-D tensors (norms and biases, written as F32 as llama.cpp writes them)
// are copies the returned File keeps alive.
#include <string>

#include "gguf/gguf.h"

namespace sieve::hf {

// A folder with config.json, or a *.safetensors / model.safetensors.index.json file in one.
bool is_model_folder(const std::string& path);

// The folder of such a path (the path itself for a folder).
std::string model_folder(const std::string& path);

// Opens the folder as a GGUF File (see above). Errors name the file at fault: config.json
// missing or malformed, an unsupported architecture or rope_scaling, a missing shard, a tensor
// of another dtype or shape than config.json implies, an unknown or missing tensor.
// A folder given as its .safetensors file reads that file's tensors only.
gguf::File open_model_folder(const std::string& path);

}  // namespace sieve::hf
