// GGUF reader: parses and validates the header of a mapped (or caller-owned) file.
//
// Hostile input is the expected case. Every read goes through Cursor, which checks it against
// the end of the file; every count is checked against the bytes left before anything is
// reserved, so memory use stays proportional to the file size (at most one Value, ~40 bytes,
// per encoded byte of array data).
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "gguf/gguf.h"
#include "gguf/gguf_format.h"

namespace sieve::gguf {
namespace {

using format::format_error;

// Reads little-endian fields front to back. Errors name the field and its byte offset.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  uint64_t offset() const { return offset_; }
  uint64_t remaining() const { return bytes_.size() - offset_; }

  template <typename T>
  T read(std::string_view what) {
    static_assert(std::is_trivially_copyable_v<T>);
    require(sizeof(T), what);
    T value;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }

  std::string read_string(std::string_view what) {
    const uint64_t start = offset_;
    const auto length = read<uint64_t>(what);
    if (length > remaining()) {
      format_error("{} at byte {} has length {}, but only {} bytes remain in the file", what, start,
                   length, remaining());
    }
    std::string text(reinterpret_cast<const char*>(bytes_.data() + offset_), length);
    offset_ += length;
    return text;
  }

  // Fails unless `count` items of at least `min_item_bytes` each fit in the bytes left.
  void require_items(uint64_t count, uint64_t min_item_bytes, std::string_view what,
                     uint64_t field_offset) const {
    if (count > remaining() / min_item_bytes) {
      format_error("{} at byte {} is {}, but only {} bytes remain (each needs at least {})", what,
                   field_offset, count, remaining(), min_item_bytes);
    }
  }

 private:
  void require(uint64_t num_bytes, std::string_view what) const {
    if (num_bytes > remaining()) {
      format_error("file ends inside the {} at byte {} (needs {} bytes, {} remain)", what, offset_,
                   num_bytes, remaining());
    }
  }

  std::span<const uint8_t> bytes_;
  uint64_t offset_ = 0;
};

template <ValueType kType, typename T>
Value make_value(T&& item) {
  Value value;
  value.data.template emplace<static_cast<size_t>(kType)>(std::forward<T>(item));
  return value;
}

Value read_value(Cursor& cursor, uint32_t type_id, int depth);

// `depth` counts this array: 1 for an array that is not inside another.
Array read_array(Cursor& cursor, int depth) {
  const uint64_t start = cursor.offset();
  if (depth > format::kMaxArrayDepth) {
    format_error("array at byte {} is nested {} deep (at most {} levels of arrays)", start, depth,
                 format::kMaxArrayDepth);
  }
  const auto elem_type_id = cursor.read<uint32_t>("array element type");
  const auto elem_type = static_cast<ValueType>(elem_type_id);
  const std::optional<uint64_t> min_size = format::min_encoded_size(elem_type);
  if (!min_size) format_error("array at byte {} has unknown element type {}", start, elem_type_id);
  const uint64_t count_offset = cursor.offset();
  const auto num_items = cursor.read<uint64_t>("array length");
  cursor.require_items(num_items, *min_size, "array length", count_offset);

  Array array;
  array.elem_type = elem_type;
  array.items.reserve(num_items);
  for (uint64_t i = 0; i < num_items; ++i) {
    array.items.push_back(read_value(cursor, elem_type_id, depth));
  }
  return array;
}

// Reads the payload of a value whose type tag has already been read.
Value read_value(Cursor& cursor, uint32_t type_id, int depth) {
  switch (static_cast<ValueType>(type_id)) {
    case ValueType::kUint8:
      return make_value<ValueType::kUint8>(cursor.read<uint8_t>("uint8"));
    case ValueType::kInt8:
      return make_value<ValueType::kInt8>(cursor.read<int8_t>("int8"));
    case ValueType::kUint16:
      return make_value<ValueType::kUint16>(cursor.read<uint16_t>("uint16"));
    case ValueType::kInt16:
      return make_value<ValueType::kInt16>(cursor.read<int16_t>("int16"));
    case ValueType::kUint32:
      return make_value<ValueType::kUint32>(cursor.read<uint32_t>("uint32"));
    case ValueType::kInt32:
      return make_value<ValueType::kInt32>(cursor.read<int32_t>("int32"));
    case ValueType::kFloat32:
      return make_value<ValueType::kFloat32>(cursor.read<float>("float32"));
    case ValueType::kUint64:
      return make_value<ValueType::kUint64>(cursor.read<uint64_t>("uint64"));
    case ValueType::kInt64:
      return make_value<ValueType::kInt64>(cursor.read<int64_t>("int64"));
    case ValueType::kFloat64:
      return make_value<ValueType::kFloat64>(cursor.read<double>("float64"));
    case ValueType::kBool: {
      const uint64_t start = cursor.offset();
      const auto byte = cursor.read<uint8_t>("bool");
      if (byte > 1) format_error("bool at byte {} is {}, not 0 or 1", start, byte);
      return make_value<ValueType::kBool>(byte == 1);
    }
    case ValueType::kString:
      return make_value<ValueType::kString>(cursor.read_string("string"));
    case ValueType::kArray:
      return make_value<ValueType::kArray>(read_array(cursor, depth + 1));
  }
  // Array element types were checked by read_array, so this is a key's own type tag.
  format_error("unknown value type {} at byte {}", type_id, cursor.offset() - sizeof(uint32_t));
}

// What the header section of a file says, validated.
struct Header {
  uint32_t version = 0;
  uint64_t alignment = format::kDefaultAlignment;
  uint64_t data_offset = 0;
  std::vector<KeyValue> metadata;
  std::vector<TensorInfo> tensors;
  detail::NameIndex key_index;
  detail::NameIndex tensor_index;
};

uint32_t read_version(Cursor& cursor) {
  if (cursor.remaining() < format::kMagic.size()) {
    format_error("file is {} bytes, too small to be GGUF", cursor.remaining());
  }
  const auto magic = cursor.read<std::array<uint8_t, 4>>("magic");
  if (magic != format::kMagic) {
    format_error("not a GGUF file: starts with bytes {:02x}, expected 47 47 55 46 (\"GGUF\")",
                 fmt::join(magic, " "));
  }
  const auto version = cursor.read<uint32_t>("version");
  if (version == 2 || version == 3) return version;
  if (version == 1) {
    format_error(
        "GGUF version 1 is not supported (only 2 and 3); re-convert the model with a "
        "current llama.cpp");
  }
  if (__builtin_bswap32(version) == 2 || __builtin_bswap32(version) == 3) {
    format_error("big-endian GGUF files are not supported");
  }
  format_error("unsupported GGUF version {} (only 2 and 3)", version);
}

void read_metadata(Cursor& cursor, uint64_t num_kvs, Header& header) {
  header.metadata.reserve(num_kvs);
  for (uint64_t i = 0; i < num_kvs; ++i) {
    const uint64_t start = cursor.offset();
    std::string key;
    try {
      key = cursor.read_string("metadata key");
      const auto type_id = cursor.read<uint32_t>("value type");
      Value value = read_value(cursor, type_id, /*depth=*/0);  // before `key` is moved from
      header.metadata.push_back({std::move(key), std::move(value)});
    } catch (const FormatError& e) {
      if (key.empty()) format_error("metadata entry {} at byte {}: {}", i, start, e.what());
      format_error("metadata key '{}' (entry {} at byte {}): {}", format::printable(key), i, start,
                   e.what());
    }
    const auto [it, inserted] = header.key_index.emplace(header.metadata.back().key, i);
    if (!inserted) {
      format_error("duplicate metadata key '{}' (entries {} and {}, the second at byte {})",
                   format::printable(it->first), it->second, i, start);
    }
  }
}

// Reads everything after the name.
void read_tensor_layout(Cursor& cursor, TensorInfo& info) {
  const uint64_t dims_offset = cursor.offset();
  const auto num_dims = cursor.read<uint32_t>("dimension count");
  if (num_dims == 0 || num_dims > format::kMaxDims) {
    format_error("dimension count at byte {} is {} (must be 1 to {})", dims_offset, num_dims,
                 format::kMaxDims);
  }
  info.shape.resize(num_dims);
  for (uint64_t& dim : info.shape) dim = cursor.read<uint64_t>("dimension");
  const uint64_t type_offset = cursor.offset();
  const auto type_id = cursor.read<uint32_t>("tensor type");
  info.type = static_cast<TensorType>(type_id);
  info.offset = cursor.read<uint64_t>("data offset");
  try {
    info.num_bytes = tensor_num_bytes(info.type, info.shape);
  } catch (const FormatError& e) {
    format_error("tensor type at byte {}: {}", type_offset, e.what());
  }
}

void read_tensor_infos(Cursor& cursor, uint64_t num_tensors, uint64_t num_tensors_offset,
                       Header& header) {
  // Checked again here: the metadata has used up part of the file since the first check.
  cursor.require_items(num_tensors, format::kMinTensorInfoBytes, "tensor count",
                       num_tensors_offset);
  header.tensors.reserve(num_tensors);
  for (uint64_t i = 0; i < num_tensors; ++i) {
    const uint64_t start = cursor.offset();
    TensorInfo& info = header.tensors.emplace_back();
    try {
      info.name = cursor.read_string("tensor name");
      read_tensor_layout(cursor, info);
    } catch (const FormatError& e) {
      if (info.name.empty()) format_error("tensor info {} at byte {}: {}", i, start, e.what());
      format_error("tensor '{}' (info {} at byte {}): {}", format::printable(info.name), i, start,
                   e.what());
    }
    const auto [it, inserted] = header.tensor_index.emplace(info.name, i);
    if (!inserted) {
      format_error("duplicate tensor name '{}' (tensors {} and {}, the second at byte {})",
                   format::printable(it->first), it->second, i, start);
    }
  }
}

uint64_t read_alignment(const Header& header) {
  const auto it = header.key_index.find(format::kAlignmentKey);
  if (it == header.key_index.end()) return format::kDefaultAlignment;
  const Value& value = header.metadata[it->second].value;
  const auto* alignment = std::get_if<uint32_t>(&value.data);
  if (alignment == nullptr) {
    format_error("'{}' has type {}, expected uint32", format::kAlignmentKey,
                 format::describe_type(value));
  }
  if (!format::is_valid_alignment(*alignment)) {
    format_error("'{}' is {}, not a nonzero power of two", format::kAlignmentKey, *alignment);
  }
  return *alignment;
}

// Every tensor must lie inside the file; tensors may overlap (ggml never writes that, but
// reading overlapping data is harmless).
void check_tensor_data(const Header& header, uint64_t file_size) {
  for (const TensorInfo& info : header.tensors) {
    if (info.offset % header.alignment != 0) {
      format_error("tensor '{}': data offset {} is not a multiple of the alignment {}",
                   format::printable(info.name), info.offset, header.alignment);
    }
    const bool fits = header.data_offset <= file_size &&
                      info.offset <= file_size - header.data_offset &&
                      info.num_bytes <= file_size - header.data_offset - info.offset;
    if (!fits) {
      format_error(
          "tensor '{}': {} bytes at offset {} of the data section (which starts at byte {}) run "
          "past the end of the file ({} bytes); the file may be truncated",
          format::printable(info.name), info.num_bytes, info.offset, header.data_offset, file_size);
    }
  }
}

Header read_header(std::span<const uint8_t> bytes) {
  Cursor cursor(bytes);
  Header header;
  header.version = read_version(cursor);
  const uint64_t num_tensors_offset = cursor.offset();
  const auto num_tensors = cursor.read<uint64_t>("tensor count");
  const uint64_t num_kvs_offset = cursor.offset();
  const auto num_kvs = cursor.read<uint64_t>("metadata count");
  cursor.require_items(num_kvs, format::kMinKeyValueBytes, "metadata count", num_kvs_offset);
  cursor.require_items(num_tensors, format::kMinTensorInfoBytes, "tensor count",
                       num_tensors_offset);

  read_metadata(cursor, num_kvs, header);
  read_tensor_infos(cursor, num_tensors, num_tensors_offset, header);
  header.alignment = read_alignment(header);
  // May lie past the end of a file without tensors (vocab-only files stop at the header).
  header.data_offset = format::align_up(cursor.offset(), header.alignment);
  check_tensor_data(header, bytes.size());
  return header;
}

}  // namespace

File File::open(const std::string& path) {
  MappedFile mapping = MappedFile::open(path);
  File file;
  try {
    file = parse(mapping.bytes());
  } catch (const FormatError& e) {
    throw FormatError(fmt::format("{}: {}", path, e.what()));
  }
  // The mapping's address does not change when it is moved, so bytes_ stays valid.
  file.mapping_ = std::move(mapping);
  return file;
}

File File::parse(std::span<const uint8_t> bytes) {
  Header header = read_header(bytes);
  File file;
  file.bytes_ = bytes;
  file.version_ = header.version;
  file.alignment_ = header.alignment;
  file.data_offset_ = header.data_offset;
  file.metadata_ = std::move(header.metadata);
  file.tensors_ = std::move(header.tensors);
  file.key_index_ = std::move(header.key_index);
  file.tensor_index_ = std::move(header.tensor_index);
  return file;
}

const Value* File::find(std::string_view key) const {
  const auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].value;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

File File::assemble(std::vector<KeyValue> metadata, std::vector<AssembledTensor> tensors,
                    std::shared_ptr<const void> storage) {
  File file;
  file.version_ = 3;
  file.storage_ = std::move(storage);
  for (size_t i = 0; i < metadata.size(); ++i) {
    if (!file.key_index_.emplace(metadata[i].key, i).second)
      format_error("duplicate metadata key '{}'", metadata[i].key);
  }
  file.metadata_ = std::move(metadata);
  uint64_t offset = 0;
  for (AssembledTensor& tensor : tensors) {
    TensorInfo info{.name = std::move(tensor.name),
                    .shape = std::move(tensor.shape),
                    .type = tensor.type,
                    .offset = offset};
    info.num_bytes = tensor_num_bytes(info.type, info.shape);
    if (info.num_bytes != tensor.data.size()) {
      format_error("tensor '{}' has {} bytes, its type and shape need {}", info.name,
                   tensor.data.size(), info.num_bytes);
    }
    if (!file.tensor_index_.emplace(info.name, file.tensors_.size()).second)
      format_error("duplicate tensor name '{}'", info.name);
    // Offsets as a writer would lay the tensors out unaligned; informative only.
    offset += info.num_bytes;
    file.tensors_.push_back(std::move(info));
    file.assembled_data_.push_back(tensor.data);
  }
  return file;
}

std::span<const uint8_t> File::tensor_data(const TensorInfo& tensor) const {
  if (!assembled_data_.empty()) {
    const TensorInfo* own = find_tensor(tensor.name);
    if (own != &tensor) fail("tensor '{}' does not belong to this file", tensor.name);
    return assembled_data_[static_cast<size_t>(own - tensors_.data())];
  }
  // Re-checked so that a TensorInfo from another file cannot read out of bounds.
  const uint64_t size = bytes_.size();
  if (data_offset_ > size || tensor.offset > size - data_offset_ ||
      tensor.num_bytes > size - data_offset_ - tensor.offset) {
    fail("tensor '{}' does not lie inside this file", tensor.name);
  }
  return bytes_.subspan(data_offset_ + tensor.offset, tensor.num_bytes);
}

// ---- Typed getters ---------------------------------------------------------------------------

namespace {

[[noreturn]] void type_mismatch(std::string_view key, const Value& value,
                                std::string_view expected) {
  format_error("metadata key '{}' has type {}, expected {}", key, format::describe_type(value),
               expected);
}

template <typename T>
constexpr bool kIsInteger = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// Converts any integer alternative of `value` to Out, failing if it is not an integer or does
// not fit. `key` and `what` only shape the error message.
template <typename Out>
Out to_integer(const Value& value, std::string_view key, std::string_view what) {
  return std::visit(
      [&](const auto& item) -> Out {
        using T = std::decay_t<decltype(item)>;
        if constexpr (kIsInteger<T>) {
          if (!std::in_range<Out>(item)) {
            format_error("metadata key '{}' is {}, which does not fit in {}", key, item, what);
          }
          return static_cast<Out>(item);
        } else {
          type_mismatch(key, value, fmt::format("an integer ({})", what));
        }
      },
      value.data);
}

const Array& array_of(const Value& value, std::string_view key, ValueType elem_type) {
  const auto* array = std::get_if<Array>(&value.data);
  if (array == nullptr || array->elem_type != elem_type) {
    type_mismatch(key, value, fmt::format("array of {}", to_string(elem_type)));
  }
  return *array;
}

}  // namespace

std::optional<std::string> File::get_string(std::string_view key) const {
  const Value* value = find(key);
  if (value == nullptr) return std::nullopt;
  const auto* text = std::get_if<std::string>(&value->data);
  if (text == nullptr) type_mismatch(key, *value, "string");
  return *text;
}

std::optional<uint64_t> File::get_u64(std::string_view key) const {
  const Value* value = find(key);
  if (value == nullptr) return std::nullopt;
  return to_integer<uint64_t>(*value, key, "uint64");
}

std::optional<int64_t> File::get_i64(std::string_view key) const {
  const Value* value = find(key);
  if (value == nullptr) return std::nullopt;
  return to_integer<int64_t>(*value, key, "int64");
}

std::optional<double> File::get_f64(std::string_view key) const {
  const Value* value = find(key);
  if (value == nullptr) return std::nullopt;
  return std::visit(
      [&](const auto& item) -> double {
        using T = std::decay_t<decltype(item)>;
        if constexpr (std::is_floating_point_v<T> || kIsInteger<T>) {
          return static_cast<double>(item);
        } else {
          type_mismatch(key, *value, "a number");
        }
      },
      value->data);
}

std::optional<bool> File::get_bool(std::string_view key) const {
  const Value* value = find(key);
  if (value == nullptr) return std::nullopt;
  const auto* flag = std::get_if<bool>(&value->data);
  if (flag == nullptr) type_mismatch(key, *value, "bool");
  return *flag;
}

std::optional<std::vector<std::string>> File::get_string_array(std::string_view key) const {
  const Value* value = find(key);
  if (value == nullptr) return std::nullopt;
  const Array& array = array_of(*value, key, ValueType::kString);
  std::vector<std::string> out;
  out.reserve(array.items.size());
  for (const Value& item : array.items) out.push_back(std::get<std::string>(item.data));
  return out;
}

std::optional<std::vector<float>> File::get_f32_array(std::string_view key) const {
  const Value* value = find(key);
  if (value == nullptr) return std::nullopt;
  const Array& array = array_of(*value, key, ValueType::kFloat32);
  std::vector<float> out;
  out.reserve(array.items.size());
  for (const Value& item : array.items) out.push_back(std::get<float>(item.data));
  return out;
}

std::optional<std::vector<int32_t>> File::get_i32_array(std::string_view key) const {
  const Value* value = find(key);
  if (value == nullptr) return std::nullopt;
  const auto* array = std::get_if<Array>(&value->data);
  const bool integer_items =
      array != nullptr && array->elem_type != ValueType::kBool &&
      array->elem_type != ValueType::kFloat32 && array->elem_type != ValueType::kFloat64 &&
      array->elem_type != ValueType::kString && array->elem_type != ValueType::kArray;
  if (!integer_items) type_mismatch(key, *value, "array of an integer type (int32)");
  std::vector<int32_t> out;
  out.reserve(array->items.size());
  for (const Value& item : array->items) out.push_back(to_integer<int32_t>(item, key, "int32"));
  return out;
}

}  // namespace sieve::gguf
