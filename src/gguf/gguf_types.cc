// Value and tensor type metadata: names, block layouts, tensor sizes.
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "gguf/gguf.h"
#include "gguf/gguf_format.h"

namespace sieve::gguf {
namespace {

// Value::data's alternatives are ordered so that the variant index is the ValueType id.
template <ValueType kType, typename T>
constexpr bool kHoldsAt =
    std::is_same_v<std::variant_alternative_t<static_cast<size_t>(kType), decltype(Value::data)>,
                   T>;
static_assert(kHoldsAt<ValueType::kUint8, uint8_t> && kHoldsAt<ValueType::kInt8, int8_t> &&
              kHoldsAt<ValueType::kUint16, uint16_t> && kHoldsAt<ValueType::kInt16, int16_t> &&
              kHoldsAt<ValueType::kUint32, uint32_t> && kHoldsAt<ValueType::kInt32, int32_t> &&
              kHoldsAt<ValueType::kFloat32, float> && kHoldsAt<ValueType::kBool, bool> &&
              kHoldsAt<ValueType::kString, std::string> && kHoldsAt<ValueType::kArray, Array> &&
              kHoldsAt<ValueType::kUint64, uint64_t> && kHoldsAt<ValueType::kInt64, int64_t> &&
              kHoldsAt<ValueType::kFloat64, double>);
static_assert(std::variant_size_v<decltype(Value::data)> == 13);

// One ggml block: `block_size` elements stored in `type_size` bytes. An empty name marks an id
// that ggml never assigned or has removed (Q4_2, Q4_0_4_4, ...). `supported`: sieve computes
// with it, i.e. kernels::kDTypeTraits has a row with this gguf_type (model::to_dtype maps it;
// tests/model checks that the two tables agree).
struct TypeTraits {
  std::string_view name;
  uint64_t block_size = 0;
  uint64_t type_size = 0;
  bool supported = false;
};
enum class Computes : bool { kNo, kYes };

constexpr uint64_t kQK = 32;     // elements per block of the legacy quants (QK4_0, QK8_0, ...)
constexpr uint64_t kQK_K = 256;  // elements per super-block of the K, IQ and TQ quants

// Sizes from ggml-common.h's block structs (static_asserted there).
constexpr auto kTypeTraits = [] {
  std::array<TypeTraits, 40> t{};
  auto set = [&t](TensorType type, std::string_view name, uint64_t block, uint64_t bytes,
                  Computes computes = Computes::kNo) {
    t[static_cast<size_t>(type)] = {name, block, bytes, computes == Computes::kYes};
  };
  set(TensorType::kF32, "F32", 1, 4, Computes::kYes);
  set(TensorType::kF16, "F16", 1, 2, Computes::kYes);
  set(TensorType::kQ4_0, "Q4_0", kQK, 2 + 16, Computes::kYes);
  set(TensorType::kQ4_1, "Q4_1", kQK, 2 + 2 + 16, Computes::kYes);
  set(TensorType::kQ5_0, "Q5_0", kQK, 2 + 4 + 16, Computes::kYes);
  set(TensorType::kQ5_1, "Q5_1", kQK, 2 + 2 + 4 + 16, Computes::kYes);
  set(TensorType::kQ8_0, "Q8_0", kQK, 2 + 32, Computes::kYes);
  set(TensorType::kQ8_1, "Q8_1", kQK, 2 + 2 + 32);
  set(TensorType::kQ2_K, "Q2_K", kQK_K, 84, Computes::kYes);
  set(TensorType::kQ3_K, "Q3_K", kQK_K, 110, Computes::kYes);
  set(TensorType::kQ4_K, "Q4_K", kQK_K, 144, Computes::kYes);
  set(TensorType::kQ5_K, "Q5_K", kQK_K, 176, Computes::kYes);
  set(TensorType::kQ6_K, "Q6_K", kQK_K, 210, Computes::kYes);
  set(TensorType::kQ8_K, "Q8_K", kQK_K, 292);
  set(TensorType::kIQ2_XXS, "IQ2_XXS", kQK_K, 66);
  set(TensorType::kIQ2_XS, "IQ2_XS", kQK_K, 74);
  set(TensorType::kIQ3_XXS, "IQ3_XXS", kQK_K, 98);
  set(TensorType::kIQ1_S, "IQ1_S", kQK_K, 50);
  set(TensorType::kIQ4_NL, "IQ4_NL", kQK, 18, Computes::kYes);
  set(TensorType::kIQ3_S, "IQ3_S", kQK_K, 110);
  set(TensorType::kIQ2_S, "IQ2_S", kQK_K, 82);
  set(TensorType::kIQ4_XS, "IQ4_XS", kQK_K, 136, Computes::kYes);
  set(TensorType::kI8, "I8", 1, 1);
  set(TensorType::kI16, "I16", 1, 2);
  set(TensorType::kI32, "I32", 1, 4);
  set(TensorType::kI64, "I64", 1, 8);
  set(TensorType::kF64, "F64", 1, 8);
  set(TensorType::kIQ1_M, "IQ1_M", kQK_K, 56);
  set(TensorType::kBF16, "BF16", 1, 2, Computes::kYes);
  set(TensorType::kTQ1_0, "TQ1_0", kQK_K, 54);
  set(TensorType::kTQ2_0, "TQ2_0", kQK_K, 66);
  set(TensorType::kMXFP4, "MXFP4", kQK, 1 + 16);
  return t;
}();

const TypeTraits* find_traits(TensorType type) {
  auto id = static_cast<uint32_t>(type);
  if (id >= kTypeTraits.size() || kTypeTraits[id].name.empty()) return nullptr;
  return &kTypeTraits[id];
}

const TypeTraits& traits_or_throw(TensorType type) {
  const TypeTraits* traits = find_traits(type);
  if (traits == nullptr) {
    format::format_error("unknown ggml tensor type id {}", static_cast<uint32_t>(type));
  }
  return *traits;
}

std::string format_shape(std::span<const uint64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

std::string_view to_string(ValueType type) {
  switch (type) {
    case ValueType::kUint8:
      return "uint8";
    case ValueType::kInt8:
      return "int8";
    case ValueType::kUint16:
      return "uint16";
    case ValueType::kInt16:
      return "int16";
    case ValueType::kUint32:
      return "uint32";
    case ValueType::kInt32:
      return "int32";
    case ValueType::kFloat32:
      return "float32";
    case ValueType::kBool:
      return "bool";
    case ValueType::kString:
      return "string";
    case ValueType::kArray:
      return "array";
    case ValueType::kUint64:
      return "uint64";
    case ValueType::kInt64:
      return "int64";
    case ValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

std::string to_string(TensorType type) {
  if (const TypeTraits* traits = find_traits(type)) return std::string(traits->name);
  return fmt::format("type {}", static_cast<uint32_t>(type));
}

bool is_supported(TensorType type) {
  const TypeTraits* traits = find_traits(type);
  return traits != nullptr && traits->supported;
}

uint64_t block_size(TensorType type) { return traits_or_throw(type).block_size; }
uint64_t type_size(TensorType type) { return traits_or_throw(type).type_size; }

uint64_t tensor_num_bytes(TensorType type, std::span<const uint64_t> shape) {
  const TypeTraits& traits = traits_or_throw(type);
  if (shape.empty() || shape.size() > format::kMaxDims) {
    format::format_error("a tensor has 1 to {} dimensions, not {}", format::kMaxDims, shape.size());
  }
  constexpr uint64_t kMaxDim = std::numeric_limits<int64_t>::max();  // ggml's ne is int64
  bool has_zero_dim = false;
  for (uint64_t dim : shape) {
    if (dim > kMaxDim) {
      format::format_error("shape {} has a dimension above ggml's limit 2^63-1",
                           format_shape(shape));
    }
    has_zero_dim = has_zero_dim || dim == 0;
  }
  if (shape[0] % traits.block_size != 0) {
    // K-quant super-blocks are 256 values: say what such rows take instead.
    format::format_error(
        "row length {} is not a multiple of the {} block size {}{}", shape[0], traits.name,
        traits.block_size,
        traits.block_size == 256 && shape[0] % 32 == 0
            ? " (rows of this length need a type with 32-value blocks, e.g. Q8_0, Q5_0 or IQ4_NL, "
              "which llama-quantize falls back to; re-quantize the model)"
            : "");
  }
  if (has_zero_dim) return 0;
  // The element count must fit too (TensorInfo::num_elements relies on it): some types store
  // a block in fewer bytes than it has elements.
  uint64_t num_elements = 1;
  for (uint64_t dim : shape) {
    if (__builtin_mul_overflow(num_elements, dim, &num_elements)) {
      format::format_error("shape {} has 2^64 or more elements", format_shape(shape));
    }
  }
  // Exact: shape[0], hence the product, is a multiple of the block size.
  uint64_t num_blocks = num_elements / traits.block_size;
  uint64_t num_bytes = 0;
  if (__builtin_mul_overflow(num_blocks, traits.type_size, &num_bytes)) {
    format::format_error("shape {} of type {} is larger than 2^64 bytes", format_shape(shape),
                         traits.name);
  }
  return num_bytes;
}

uint64_t TensorInfo::num_elements() const {
  uint64_t count = 1;
  for (uint64_t dim : shape) count *= dim;  // fits: tensor_num_bytes checked the product
  return count;
}

namespace format {

std::string describe_type(const Value& value) {
  if (const auto* array = std::get_if<Array>(&value.data)) {
    return fmt::format("array of {}", to_string(array->elem_type));
  }
  return std::string(to_string(value.type()));
}

std::string printable(std::string_view name) {
  constexpr size_t kMaxBytes = 96;
  std::string out;
  for (const char c : name.substr(0, kMaxBytes)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f || c == '\\') {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  if (name.size() > kMaxBytes) out += fmt::format("... ({} bytes)", name.size());
  return out;
}

}  // namespace format
}  // namespace sieve::gguf
