// GGUF v3 writer. Output layout (offsets relative to the data section, which starts at the
// first multiple of the alignment after the tensor infos):
//
//   header | metadata | tensor infos | 0-pad | tensor 0 | 0-pad | tensor 1 | 0-pad | ...
//                                           ^ data section, each tensor at a multiple of
//                                             the alignment; like llama.cpp, the last tensor
//                                             is padded too
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "gguf/gguf.h"
#include "gguf/gguf_format.h"

namespace sieve::gguf {
namespace {

// Appends little-endian fields to a growing buffer.
class ByteSink {
 public:
  template <typename T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* raw = reinterpret_cast<const uint8_t*>(&value);
    bytes_.insert(bytes_.end(), raw, raw + sizeof(T));
  }
  void put_string(std::string_view text) {
    put<uint64_t>(text.size());
    bytes_.insert(bytes_.end(), text.begin(), text.end());
  }
  void pad_to(uint64_t alignment) { bytes_.resize(format::align_up(bytes_.size(), alignment), 0); }
  std::span<const uint8_t> bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// Writes a value without its type tag, checking what the reader would reject.
void put_payload(ByteSink& sink, std::string_view key, const Value& value, int depth) {
  std::visit(
      [&](const auto& item) {
        using T = std::decay_t<decltype(item)>;
        if constexpr (std::is_same_v<T, std::string>) {
          sink.put_string(item);
        } else if constexpr (std::is_same_v<T, Array>) {
          if (depth + 1 > format::kMaxArrayDepth) {
            fail("metadata key '{}': arrays nest deeper than {} levels", key,
                 format::kMaxArrayDepth);
          }
          if (!format::min_encoded_size(item.elem_type)) {
            fail("metadata key '{}': array element type {} is not a GGUF value type", key,
                 static_cast<uint32_t>(item.elem_type));
          }
          sink.put<uint32_t>(static_cast<uint32_t>(item.elem_type));
          sink.put<uint64_t>(item.items.size());
          for (const Value& element : item.items) {
            if (element.type() != item.elem_type) {
              fail("metadata key '{}': array of {} holds an item of type {}", key,
                   to_string(item.elem_type), to_string(element.type()));
            }
            put_payload(sink, key, element, depth + 1);
          }
        } else if constexpr (std::is_same_v<T, bool>) {
          sink.put<uint8_t>(item ? 1 : 0);
        } else {
          sink.put(item);
        }
      },
      value.data);
}

uint64_t output_alignment(const std::vector<KeyValue>& metadata) {
  const auto it = std::find_if(metadata.begin(), metadata.end(),
                               [](const KeyValue& kv) { return kv.key == format::kAlignmentKey; });
  if (it == metadata.end()) return format::kDefaultAlignment;
  const auto* alignment = std::get_if<uint32_t>(&it->value.data);
  if (alignment == nullptr) {
    fail("'{}' must be a uint32, not {}", format::kAlignmentKey, format::describe_type(it->value));
  }
  if (!format::is_valid_alignment(*alignment)) {
    fail("'{}' is {}, not a nonzero power of two", format::kAlignmentKey, *alignment);
  }
  return *alignment;
}

void emit_zeros(uint64_t count, const std::function<void(std::span<const uint8_t>)>& sink) {
  static constexpr std::array<uint8_t, 4096> kZeros{};
  while (count > 0) {
    const uint64_t chunk = std::min<uint64_t>(count, kZeros.size());
    sink(std::span<const uint8_t>(kZeros.data(), chunk));
    count -= chunk;
  }
}

}  // namespace

void Writer::set(std::string key, Value value) {
  const auto it = std::find_if(metadata_.begin(), metadata_.end(),
                               [&](const KeyValue& kv) { return kv.key == key; });
  if (it != metadata_.end()) {
    it->value = std::move(value);
  } else {
    metadata_.push_back({std::move(key), std::move(value)});
  }
}

void Writer::set_string(std::string key, std::string value) {
  set(std::move(key), Value{std::move(value)});
}
void Writer::set_u32(std::string key, uint32_t value) { set(std::move(key), Value{value}); }
void Writer::set_f32(std::string key, float value) { set(std::move(key), Value{value}); }
void Writer::set_bool(std::string key, bool value) { set(std::move(key), Value{value}); }

void Writer::copy_from(const File& file, std::string_view key) {
  const Value* value = file.find(key);
  if (value == nullptr) {
    fail("cannot copy metadata key '{}': the source file does not have it", key);
  }
  set(std::string(key), *value);
}

void Writer::add_tensor(std::string name, TensorType type, std::vector<uint64_t> shape,
                        std::vector<uint8_t> data) {
  const bool duplicate = std::any_of(tensors_.begin(), tensors_.end(),
                                     [&](const auto& tensor) { return tensor.info.name == name; });
  if (duplicate) fail("tensor '{}' was already added", name);
  uint64_t num_bytes = 0;
  try {
    num_bytes = tensor_num_bytes(type, shape);
  } catch (const FormatError& e) {
    fail("tensor '{}': {}", name, e.what());
  }
  if (data.size() != num_bytes) {
    fail("tensor '{}': shape [{}] of type {} needs {} bytes, got {}", name, fmt::join(shape, ", "),
         to_string(type), num_bytes, data.size());
  }
  PendingTensor& tensor = tensors_.emplace_back();
  tensor.info.name = std::move(name);
  tensor.info.type = type;
  tensor.info.shape = std::move(shape);
  tensor.info.num_bytes = num_bytes;
  tensor.data = std::move(data);
}

void Writer::emit(const std::function<void(std::span<const uint8_t>)>& sink) const {
  const uint64_t alignment = output_alignment(metadata_);
  ByteSink header;
  header.put(format::kMagic);
  header.put<uint32_t>(format::kWriteVersion);
  header.put<uint64_t>(tensors_.size());
  header.put<uint64_t>(metadata_.size());
  for (const KeyValue& kv : metadata_) {
    header.put_string(kv.key);
    header.put<uint32_t>(static_cast<uint32_t>(kv.value.type()));
    put_payload(header, kv.key, kv.value, /*depth=*/0);
  }
  uint64_t offset = 0;  // of the next tensor, from the start of the data section
  for (const PendingTensor& tensor : tensors_) {
    header.put_string(tensor.info.name);
    header.put<uint32_t>(static_cast<uint32_t>(tensor.info.shape.size()));
    for (uint64_t dim : tensor.info.shape) header.put<uint64_t>(dim);
    header.put<uint32_t>(static_cast<uint32_t>(tensor.info.type));
    header.put<uint64_t>(offset);
    offset = format::align_up(offset + tensor.data.size(), alignment);
  }
  header.pad_to(alignment);

  sink(header.bytes());
  for (const PendingTensor& tensor : tensors_) {
    sink(tensor.data);
    emit_zeros(format::align_up(tensor.data.size(), alignment) - tensor.data.size(), sink);
  }
}

std::vector<uint8_t> Writer::to_bytes() const {
  std::vector<uint8_t> bytes;
  emit([&](std::span<const uint8_t> piece) {
    bytes.insert(bytes.end(), piece.begin(), piece.end());
  });
  return bytes;
}

void Writer::write(const std::string& path) const {
  // Readers of `path` see either the old file or the complete new one, never a partial write.
  const std::string tmp_path = path + ".tmp";
  std::FILE* out = std::fopen(tmp_path.c_str(), "wb");
  if (out == nullptr) fail("cannot create '{}': {}", tmp_path, std::strerror(errno));
  auto discard = [&] {
    if (out != nullptr) std::fclose(out);
    std::remove(tmp_path.c_str());
  };
  try {
    emit([&](std::span<const uint8_t> piece) {
      if (!piece.empty() && std::fwrite(piece.data(), 1, piece.size(), out) != piece.size()) {
        fail("cannot write '{}': {}", tmp_path, std::strerror(errno));
      }
    });
    if (std::fflush(out) != 0 || ::fsync(::fileno(out)) != 0) {
      fail("cannot write '{}': {}", tmp_path, std::strerror(errno));
    }
    const int close_result = std::fclose(std::exchange(out, nullptr));
    if (close_result != 0) fail("cannot write '{}': {}", tmp_path, std::strerror(errno));
    if (std::rename(tmp_path.c_str(), path.c_str()) != 0) {
      fail("cannot rename '{}' to '{}': {}", tmp_path, path, std::strerror(errno));
    }
  } catch (...) {
    discard();
    throw;
  }
}

}  // namespace sieve::gguf
