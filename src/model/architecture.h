#pragma once
// Every `general.architecture` sieve runs, described as data in one table (architecture.cc):
// which tensors a layer has, which are fused, which are optional, the RoPE ordering and which
// GGUF keys count. Loading (config.cc, weights.cc) reads this description; the forward pass
// (llama.cc) only looks at which tensors were found, never at the architecture's name.
//
// All of them are pre-norm decoders with RMSNorm, GQA attention with RoPE and a SwiGLU FFN:
//
//   arch      Q/K/V            extras                               FFN in      RoPE
//   llama     attn_q, _k, _v   optional Q/K/V biases                gate, up    normal
//   mistral   as llama; honours <arch>.attention.sliding_window
//   qwen2     attn_q, _k, _v   Q/K/V biases                         gate, up    neox
//   qwen3     attn_q, _k, _v   per-head RMSNorm on Q, K (attn_q_norm, attn_k_norm
//                              [head_dim]) before RoPE; n_head*head_dim may differ from n_embd
//   phi3      attn_qkv fused   optional LongRoPE factors            ffn_up fused neox
//                              (rows Q, K, V)                       (rows gate, up)
//
// Every architecture ties the output matrix to token_embd when `output.weight` is absent.
#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/rope.h"

namespace sieve::model {

enum class TensorPresence : uint8_t {
  kAbsent,    // the architecture has no such tensor; a file that has one is rejected
  kOptional,  // used when the file has it
  kRequired,  // loading fails naming the tensor when it is missing
};

enum class QkvLayout : uint8_t {
  kSeparate,  // attn_q [q_dim][dim], attn_k, attn_v [kv_dim][dim]
  kFused,     // attn_qkv [q_dim + 2 kv_dim][dim]: rows Q, then K, then V
};

enum class FfnLayout : uint8_t {
  kSeparate,     // ffn_gate, ffn_up [ffn_dim][dim]
  kFusedGateUp,  // ffn_up [2 ffn_dim][dim]: rows gate, then up; no ffn_gate
};

struct Architecture {
  std::string_view name;  // general.architecture; GGUF keys are "<name>.<key>"
  kernels::RopeOrdering rope_ordering;
  QkvLayout qkv_layout;
  FfnLayout ffn_layout;
  TensorPresence qkv_bias;  // attn_q.bias [q_dim], attn_k.bias, attn_v.bias [kv_dim]
  TensorPresence qk_norm;   // attn_q_norm.weight, attn_k_norm.weight [head_dim]
  // LongRoPE (Phi-3.5-mini, Phi-3-*-128k): rope_factors_long/short.weight [rope dims / 2],
  // per-pair frequency divisors. llama.cpp uses the long ones when its context exceeds
  // rope.scaling.original_context_length, which is the case at the model's full context (its
  // default and sieve's): sieve uses the long ones.
  TensorPresence long_rope_factors;
  // Whether `<name>.attention.sliding_window` restricts attention. llama.cpp ignores the key
  // for phi3 (Phi-3-mini-4k declares 2047 and is run with full attention), and so does sieve.
  bool honours_sliding_window;
};

// The description of `name`; throws sieve::Error naming the supported architectures.
const Architecture& find_architecture(std::string_view name);
// "llama, mistral, qwen2, qwen3, phi3"
std::string supported_architectures();

// GGUF tensor names (the same across these architectures, as llama.cpp names them).
namespace tensor_name {
inline constexpr std::string_view kTokenEmbd = "token_embd.weight";
inline constexpr std::string_view kOutputNorm = "output_norm.weight";
inline constexpr std::string_view kOutput = "output.weight";
inline constexpr std::string_view kRopeFreqs = "rope_freqs.weight";  // Llama 3.1 [rope dims / 2]
inline constexpr std::string_view kRopeFactorsLong = "rope_factors_long.weight";    // LongRoPE
inline constexpr std::string_view kRopeFactorsShort = "rope_factors_short.weight";  // LongRoPE
// Per layer, after "blk.<i>.":
inline constexpr std::string_view kAttnNorm = "attn_norm.weight";
inline constexpr std::string_view kAttnQ = "attn_q.weight";
inline constexpr std::string_view kAttnK = "attn_k.weight";
inline constexpr std::string_view kAttnV = "attn_v.weight";
inline constexpr std::string_view kAttnQkv = "attn_qkv.weight";
inline constexpr std::string_view kAttnQBias = "attn_q.bias";
inline constexpr std::string_view kAttnKBias = "attn_k.bias";
inline constexpr std::string_view kAttnVBias = "attn_v.bias";
inline constexpr std::string_view kAttnQNorm = "attn_q_norm.weight";
inline constexpr std::string_view kAttnKNorm = "attn_k_norm.weight";
inline constexpr std::string_view kAttnOutput = "attn_output.weight";
inline constexpr std::string_view kFfnNorm = "ffn_norm.weight";
inline constexpr std::string_view kFfnGate = "ffn_gate.weight";
inline constexpr std::string_view kFfnUp = "ffn_up.weight";
inline constexpr std::string_view kFfnDown = "ffn_down.weight";

// "blk.<layer>.<name>"
std::string layer(int64_t layer, std::string_view name);
}  // namespace tensor_name

}  // namespace sieve::model
