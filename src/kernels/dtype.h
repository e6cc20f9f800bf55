#pragma once
// The weight and KV element types, and one table of what every layer asks about each: its name,
// its block (elements and bytes), its GGUF ids, whether KV pages may hold it. Code that needs a
// fact about a type reads kDTypeTraits (through dtype_traits() or the helpers below) instead of
// switching on the type; the switches left are the kernels' own dispatch (one table of row
// codecs in ops.cc, the CPU matmul's in cpu/, the reference's in ref/).
//
// Block layouts are exactly ggml's (GGUF):
//   F32   4 bytes/value            F16  IEEE half          BF16  upper half of an f32
//   Q8_0  blocks of 32: { f16 d; int8 q[32]; }           (34 bytes)  x = d * q
//   Q4_0  blocks of 32: { f16 d; uint8 qs[16]; }          (18 bytes)
//         x[j] = d * ((qs[j] & 0xF) - 8),  x[j + 16] = d * ((qs[j] >> 4) - 8)
// and the other ggml weight types (block structs and value formulas in kernels/blocks.h, which
// static_asserts their sizes against this table in ops.cc):
//   Q4_1 (32 / 20 bytes), Q5_0 (32 / 22), Q5_1 (32 / 24), IQ4_NL (32 / 18),
//   K-quants in super-blocks of 256: Q2_K (84), Q3_K (110), Q4_K (144), Q5_K (176), Q6_K (210),
//   IQ4_XS (256 / 136).
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string_view>

namespace sieve::kernels {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kIQ4_NL,  // blocks of 32
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kIQ4_XS,  // super-blocks of 256
};
// Every dtype, in enum order (for loops in tests, parsers and error messages).
inline constexpr DType kAllDTypes[] = {
    DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,   DType::kQ4_0,
    DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kIQ4_NL, DType::kQ2_K,
    DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K,   DType::kIQ4_XS,
};

// How a type stores its values: one per element, or in blocks of 32 or super-blocks of 256 with
// integer levels and f16 scales. The matmul kernels quantize their activations to match
// (kFloat: none; kBlock32: Q8_0 / Q8_1; kSuperBlock: Q8_K).
enum class DTypeFamily : uint8_t { kFloat, kBlock32, kSuperBlock };

struct DTypeTraits {
  DType dtype;
  std::string_view name;  // as GGUF and llama.cpp print it: "F32", "Q4_K", ...
  DTypeFamily family;
  int64_t block_elems;  // 1 for float types, 32 or 256 for quantized ones
  size_t block_bytes;   // bytes of one block (of one value for float types)
  uint32_t gguf_type;   // ggml's tensor type id, as a GGUF file stores it (gguf::TensorType)
  // llama.cpp's general.file_type of a file mostly of this type (for K-quants, its _M mix).
  uint32_t gguf_file_type;
  // What llama-quantize writes instead when a row is not a multiple of this type's block (the
  // super-block types fall back to a block-of-32 one); nullopt: nothing, the row must fit.
  std::optional<DType> quantize_fallback;
  // The name as a KV-cache element type (--kv-dtype, metrics); empty where KV pages cannot hold
  // the type (the attention kernels read F32, F16, Q8_0 and Q4_1 rows only).
  std::string_view kv_name;
};

// Indexed by DType (checked below).
inline constexpr DTypeTraits kDTypeTraits[] = {
    {DType::kF32, "F32", DTypeFamily::kFloat, 1, 4, 0, 0, std::nullopt, "f32"},
    {DType::kF16, "F16", DTypeFamily::kFloat, 1, 2, 1, 1, std::nullopt, "f16"},
    {DType::kBF16, "BF16", DTypeFamily::kFloat, 1, 2, 30, 32, std::nullopt, ""},
    {DType::kQ8_0, "Q8_0", DTypeFamily::kBlock32, 32, 34, 8, 7, std::nullopt, "q8"},
    {DType::kQ4_0, "Q4_0", DTypeFamily::kBlock32, 32, 18, 2, 2, std::nullopt, ""},
    {DType::kQ4_1, "Q4_1", DTypeFamily::kBlock32, 32, 20, 3, 3, std::nullopt, "q4"},
    {DType::kQ5_0, "Q5_0", DTypeFamily::kBlock32, 32, 22, 6, 8, std::nullopt, ""},
    {DType::kQ5_1, "Q5_1", DTypeFamily::kBlock32, 32, 24, 7, 9, std::nullopt, ""},
    {DType::kIQ4_NL, "IQ4_NL", DTypeFamily::kBlock32, 32, 18, 20, 25, std::nullopt, ""},
    {DType::kQ2_K, "Q2_K", DTypeFamily::kSuperBlock, 256, 84, 10, 10, DType::kIQ4_NL, ""},
    {DType::kQ3_K, "Q3_K", DTypeFamily::kSuperBlock, 256, 110, 11, 12, DType::kIQ4_NL, ""},
    {DType::kQ4_K, "Q4_K", DTypeFamily::kSuperBlock, 256, 144, 12, 15, DType::kQ5_0, ""},
    {DType::kQ5_K, "Q5_K", DTypeFamily::kSuperBlock, 256, 176, 13, 17, DType::kQ5_1, ""},
    {DType::kQ6_K, "Q6_K", DTypeFamily::kSuperBlock, 256, 210, 14, 18, DType::kQ8_0, ""},
    {DType::kIQ4_XS, "IQ4_XS", DTypeFamily::kSuperBlock, 256, 136, 23, 30, DType::kIQ4_NL, ""},
};
static_assert(std::size(kDTypeTraits) == std::size(kAllDTypes));
static_assert([] {
  for (size_t i = 0; i < std::size(kDTypeTraits); ++i) {
    const DTypeTraits& t = kDTypeTraits[i];
    if (static_cast<size_t>(t.dtype) != i || kAllDTypes[i] != t.dtype) return false;
    if ((t.family == DTypeFamily::kFloat) != (t.block_elems == 1)) return false;
    if (t.quantize_fallback &&
        kDTypeTraits[static_cast<size_t>(*t.quantize_fallback)].block_elems >= t.block_elems)
      return false;
  }
  return true;
}());

constexpr const DTypeTraits& dtype_traits(DType dtype) {
  return kDTypeTraits[static_cast<size_t>(dtype)];
}
constexpr std::string_view to_string(DType dtype) { return dtype_traits(dtype).name; }
constexpr int64_t block_elems(DType dtype) { return dtype_traits(dtype).block_elems; }
constexpr size_t block_bytes(DType dtype) { return dtype_traits(dtype).block_bytes; }
constexpr bool is_quantized(DType dtype) { return block_elems(dtype) > 1; }
// num_cols must be a multiple of block_elems.
constexpr size_t row_bytes(DType dtype, int64_t num_cols) {
  assert(num_cols >= 0 && num_cols % block_elems(dtype) == 0);
  return static_cast<size_t>(num_cols / block_elems(dtype)) * block_bytes(dtype);
}

// The dtypes a KV pool may have.
constexpr bool is_kv_dtype(DType dtype) { return !dtype_traits(dtype).kv_name.empty(); }
// Q8_0 / Q4_1: KV rows of head_dim values in blocks of 32.
constexpr bool is_block_kv_dtype(DType dtype) { return is_kv_dtype(dtype) && is_quantized(dtype); }

// The dtype whose gguf_type is `gguf_type`; nullopt for a type sieve cannot compute with.
constexpr std::optional<DType> dtype_of_gguf_type(uint32_t gguf_type) {
  for (const DTypeTraits& t : kDTypeTraits) {
    if (t.gguf_type == gguf_type) return t.dtype;
  }
  return std::nullopt;
}

}  // namespace sieve::kernels
