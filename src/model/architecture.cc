#include "model/architecture.h"

#include <array>

#include "util/error.h"

namespace sieve::model {

namespace {

using kernels::RopeOrdering;
using enum TensorPresence;

// Facts from llama.cpp's loaders for these architectures (src/llama-model.cpp, src/models/*).
constexpr std::array kArchitectures = {
    Architecture{.name = "llama",
                 .rope_ordering = RopeOrdering::kNormal,
                 .qkv_layout = QkvLayout::kSeparate,
                 .ffn_layout = FfnLayout::kSeparate,
                 .qkv_bias = kOptional,
                 .qk_norm = kAbsent,
                 .long_rope_factors = kAbsent,
                 .honours_sliding_window = true},
    Architecture{.name = "mistral",
                 .rope_ordering = RopeOrdering::kNormal,
                 .qkv_layout = QkvLayout::kSeparate,
                 .ffn_layout = FfnLayout::kSeparate,
                 .qkv_bias = kOptional,
                 .qk_norm = kAbsent,
                 .long_rope_factors = kAbsent,
                 .honours_sliding_window = true},
    Architecture{.name = "qwen2",
                 .rope_ordering = RopeOrdering::kNeox,
                 .qkv_layout = QkvLayout::kSeparate,
                 .ffn_layout = FfnLayout::kSeparate,
                 .qkv_bias = kRequired,
                 .qk_norm = kAbsent,
                 .long_rope_factors = kAbsent,
                 .honours_sliding_window = false},
    Architecture{.name = "qwen3",
                 .rope_ordering = RopeOrdering::kNeox,
                 .qkv_layout = QkvLayout::kSeparate,
                 .ffn_layout = FfnLayout::kSeparate,
                 .qkv_bias = kAbsent,
                 .qk_norm = kRequired,
                 .long_rope_factors = kAbsent,
                 .honours_sliding_window = false},
    Architecture{.name = "phi3",
                 .rope_ordering = RopeOrdering::kNeox,
                 .qkv_layout = QkvLayout::kFused,
                 .ffn_layout = FfnLayout::kFusedGateUp,
                 .qkv_bias = kAbsent,
                 .qk_norm = kAbsent,
                 .long_rope_factors = kOptional,
                 .honours_sliding_window = false},
};

}  // namespace

const Architecture& find_architecture(std::string_view name) {
  for (const Architecture& arch : kArchitectures) {
    if (arch.name == name) return arch;
  }
  fail("unsupported model architecture '{}' (general.architecture); sieve runs: {}", name,
       supported_architectures());
}

std::string supported_architectures() {
  std::string list;
  for (const Architecture& arch : kArchitectures) {
    if (!list.empty()) list += ", ";
    list += arch.name;
  }
  return list;
}

std::string tensor_name::layer(int64_t layer, std::string_view name) {
  return "blk." + std::to_string(layer) + "." + std::string(name);
}

}  // namespace sieve::model
