#pragma once
// Internal to src/gguf: wire-format constants and rules shared by the reader and the writer.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <bit>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "gguf/gguf.h"

namespace sieve::gguf::format {

static_assert(std::endian::native == std::endian::little,
              "GGUF is little-endian and is read by memcpy; big-endian hosts are not supported");

inline constexpr std::array<uint8_t, 4> kMagic = {'G', 'G', 'U', 'F'};
inline constexpr uint32_t kWriteVersion = 3;
inline constexpr std::string_view kAlignmentKey = "general.alignment";
inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
// Arrays may contain arrays; parsing recurses once per level, so the depth is capped to keep a
// hostile file from exhausting the stack. Depth 1 is a plain array.
inline constexpr int kMaxArrayDepth = 8;

// Smallest encodings, used to bound counts against the bytes left before anything is reserved.
inline constexpr uint64_t kMinKeyValueBytes = 8 + 4 + 1;            // empty key, type, 1-byte value
inline constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, 1 dim
inline constexpr uint64_t kStringHeaderBytes = 8;                   // u64 length
inline constexpr uint64_t kArrayHeaderBytes = 4 + 8;                // u32 elem type, u64 count

template <typename... Args>
[[noreturn]] void format_error(fmt::format_string<Args...> format, Args&&... args) {
  throw FormatError(fmt::format(format, std::forward<Args>(args)...));
}

// Bytes one value of `type` takes in the file, excluding its type tag: exact for scalars, the
// minimum for strings and arrays; nullopt for an unknown type id.
constexpr std::optional<uint64_t> min_encoded_size(ValueType type) {
  switch (type) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool:
      return 1;
    case ValueType::kUint16:
    case ValueType::kInt16:
      return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32:
      return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
      return 8;
    case ValueType::kString:
      return kStringHeaderBytes;
    case ValueType::kArray:
      return kArrayHeaderBytes;
  }
  return std::nullopt;
}

constexpr bool is_valid_alignment(uint64_t alignment) { return std::has_single_bit(alignment); }

// Rounds `offset` up to a multiple of `alignment` (a power of two). Callers keep
// offset + alignment below 2^64: offsets are bounded by a file size, alignments by uint32.
constexpr uint64_t align_up(uint64_t offset, uint64_t alignment) {
  return (offset + alignment - 1) & ~(alignment - 1);
}

// "uint32", or "array of string" for arrays.
std::string describe_type(const Value& value);

// A key or tensor name from a file, made safe to put in an error message: control bytes are
// escaped as \xNN and anything past 96 bytes is cut.
std::string printable(std::string_view name);

}  // namespace sieve::gguf::format
