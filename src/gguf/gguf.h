#pragma once
// GGUF model files (versions 2 and 3): a validating, memory-mapped reader and a writer.
//
// File layout (all little-endian):
//   magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv_count × { string key | u32 value_type | value }
//   tensor_count × { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
//   padding to `general.alignment` (default 32)
//   tensor data; each tensor at data_start + offset, offset a multiple of the alignment
// string = u64 length + bytes (no terminator); array = u32 elem_type + u64 count + elements.
//
// Every count, length, shape and offset is checked against the file size before use: a
// truncated or hostile file produces sieve::gguf::FormatError with a message that names what
// was wrong and where, never an out-of-bounds read or an unbounded allocation.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "util/error.h"
#include "util/mapped_file.h"

namespace sieve::gguf {

class FormatError : public Error {
 public:
  using Error::Error;
};

enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
std::string_view to_string(ValueType type);

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type): what the tokenizer reads and
// a converter (hf/hf_tokenizer.cc) writes.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// ggml tensor type ids as written in the file. Only the ones sieve can compute with are
// "supported"; the others are named so that errors can say which type a tensor has.
enum class TensorType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};
std::string to_string(TensorType type);  // "F32", "Q4_K", or "type 99" if unknown
bool is_supported(TensorType type);      // the types model::to_dtype maps (kernels::DType)
// Elements per block and bytes per block (F32: 1/4, F16: 1/2, Q8_0: 32/34, Q4_0: 32/18 ...).
// Throws FormatError for types whose layout sieve does not know.
uint64_t block_size(TensorType type);
uint64_t type_size(TensorType type);
// Bytes of a tensor with this type and shape (ggml order, 1 to 4 dimensions). Throws FormatError
// when the type is unknown, shape[0] is not a multiple of block_size(type), a dimension exceeds
// ggml's int64 limit, or the size does not fit in uint64.
uint64_t tensor_num_bytes(TensorType type, std::span<const uint64_t> shape);

struct Value;
struct Array {
  ValueType elem_type = ValueType::kUint8;
  std::vector<Value> items;
  bool operator==(const Array&) const = default;
};

struct Value {
  std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool, std::string,
               Array, uint64_t, int64_t, double>
      data;
  ValueType type() const { return static_cast<ValueType>(data.index()); }
  bool operator==(const Value&) const = default;  // floats compare by value (NaN != NaN)
};

struct KeyValue {
  std::string key;
  Value value;
  bool operator==(const KeyValue&) const = default;
};

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> shape;  // ggml order: shape[0] is the contiguous (row) dimension
  TensorType type = TensorType::kF32;
  uint64_t offset = 0;     // from the start of the data section
  uint64_t num_bytes = 0;  // computed from shape and type
  uint64_t num_elements() const;
};

namespace detail {
// Name -> position, with heterogeneous lookup so that find(std::string_view) builds no string.
struct NameHash {
  using is_transparent = void;
  size_t operator()(std::string_view name) const { return std::hash<std::string_view>{}(name); }
};
using NameIndex = std::unordered_map<std::string, size_t, NameHash, std::equal_to<>>;
}  // namespace detail

class File {
 public:
  // Maps and validates the file. Throws FormatError (or sieve::Error for I/O problems).
  static File open(const std::string& path);
  // Parses bytes the caller keeps alive for the File's lifetime (tests, fuzzing).
  static File parse(std::span<const uint8_t> bytes);
  // A File described in memory rather than read: what a converter would write (another format's
  // weights under GGUF names and keys, e.g. a Hugging Face folder), whose tensor bytes lie
  // wherever `storage` keeps them (mappings of other files, converted buffers). No copy of the
  // tensors is made. Throws FormatError for duplicate keys or names, or a tensor whose bytes do
  // not match its type and shape.
  struct AssembledTensor {
    std::string name;
    TensorType type = TensorType::kF32;
    std::vector<uint64_t> shape;  // ggml order
    std::span<const uint8_t> data;
  };
  static File assemble(std::vector<KeyValue> metadata, std::vector<AssembledTensor> tensors,
                       std::shared_ptr<const void> storage);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::vector<KeyValue>& metadata() const { return metadata_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  const Value* find(std::string_view key) const;
  const TensorInfo* find_tensor(std::string_view name) const;

  // Typed getters: std::nullopt when the key is absent; FormatError naming the key and both
  // types when it is present with an incompatible type. Integer getters accept any integer
  // type whose value fits; get_f64 accepts float32/float64 (and integers).
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<uint64_t> get_u64(std::string_view key) const;
  std::optional<int64_t> get_i64(std::string_view key) const;
  std::optional<double> get_f64(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::vector<std::string>> get_string_array(std::string_view key) const;
  std::optional<std::vector<float>> get_f32_array(std::string_view key) const;
  std::optional<std::vector<int32_t>> get_i32_array(std::string_view key) const;

  // Bytes of a tensor's data (validated to lie inside the file at open time).
  std::span<const uint8_t> tensor_data(const TensorInfo& tensor) const;

 private:
  MappedFile mapping_;  // empty when parsed from caller-owned bytes
  std::span<const uint8_t> bytes_;
  // Assembled files: each tensor's bytes (parallel to tensors_), kept alive by storage_.
  std::vector<std::span<const uint8_t>> assembled_data_;
  std::shared_ptr<const void> storage_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> metadata_;
  std::vector<TensorInfo> tensors_;
  detail::NameIndex key_index_;     // key -> position in metadata_
  detail::NameIndex tensor_index_;  // tensor name -> position in tensors_
};

// Writes GGUF v3. Keys and tensors are written in the order they were added.
class Writer {
 public:
  void set(std::string key, Value value);  // replaces an existing key of the same name
  void set_string(std::string key, std::string value);
  void set_u32(std::string key, uint32_t value);
  void set_f32(std::string key, float value);
  void set_bool(std::string key, bool value);
  // Copies a key (with its value) verbatim from another file.
  void copy_from(const File& file, std::string_view key);

  // shape in ggml order (shape[0] = row length). data.size() must equal the size implied by
  // shape and type.
  void add_tensor(std::string name, TensorType type, std::vector<uint64_t> shape,
                  std::vector<uint8_t> data);

  // Writes the file (atomically: to path + ".tmp", then renamed). Throws sieve::Error.
  void write(const std::string& path) const;
  // The whole file in memory (tests, fuzzing): an expensive copy of every tensor's data.
  std::vector<uint8_t> to_bytes() const;

 private:
  struct PendingTensor {
    TensorInfo info;
    std::vector<uint8_t> data;
  };
  // Validates everything, then hands the file to `sink` in consecutive pieces.
  void emit(const std::function<void(std::span<const uint8_t>)>& sink) const;

  std::vector<KeyValue> metadata_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace sieve::gguf
