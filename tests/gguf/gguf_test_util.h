#pragma once
// Helpers for GGUF tests: raw little-endian file building, byte patching, temp folders.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"

namespace sieve::gguf::testing {

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, std::span<const uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

// Builds GGUF bytes field by field, including fields the Writer refuses to produce.
class RawGguf {
 public:
  RawGguf& magic() { return raw("GGUF"); }
  RawGguf& u8(uint8_t v) { return put(v); }
  RawGguf& u32(uint32_t v) { return put(v); }
  RawGguf& u64(uint64_t v) { return put(v); }
  RawGguf& str(std::string_view s) {
    u64(s.size());
    return raw(s);
  }
  RawGguf& raw(std::string_view s) {
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  RawGguf& zeros(size_t n) {
    bytes_.resize(bytes_.size() + n, 0);
    return *this;
  }
  // magic, version 3, counts
  RawGguf& header(uint64_t num_tensors, uint64_t num_kvs) {
    return magic().u32(3).u64(num_tensors).u64(num_kvs);
  }
  RawGguf& kv_u32(std::string_view key, uint32_t v) {
    return str(key).u32(static_cast<uint32_t>(ValueType::kUint32)).u32(v);
  }
  // A tensor info (name, dims, type, offset).
  RawGguf& tensor(std::string_view name, const std::vector<uint64_t>& shape, TensorType type,
                  uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(shape.size()));
    for (uint64_t d : shape) u64(d);
    return u32(static_cast<uint32_t>(type)).u64(offset);
  }
  // Zero padding up to a multiple of `alignment`.
  RawGguf& pad(size_t alignment) {
    return zeros((alignment - bytes_.size() % alignment) % alignment);
  }
  size_t size() const { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  template <typename T>
  RawGguf& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
    return *this;
  }
  std::vector<uint8_t> bytes_;
};

// Offset of the first occurrence of `needle` at or after `from`; fails the test if absent.
inline size_t find_bytes(const std::vector<uint8_t>& bytes, std::string_view needle,
                         size_t from = 0) {
  auto it = std::search(bytes.begin() + static_cast<ptrdiff_t>(from), bytes.end(), needle.begin(),
                        needle.end());
  if (it == bytes.end()) {
    ADD_FAILURE() << "bytes '" << needle << "' not found";
    throw std::runtime_error("find_bytes");
  }
  return static_cast<size_t>(it - bytes.begin());
}

template <typename T>
void patch(std::vector<uint8_t>& bytes, size_t offset, T value) {
  ASSERT_LE(offset + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

template <typename T>
T peek(const std::vector<uint8_t>& bytes, size_t offset) {
  T value{};
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

// Where the fields of a tensor info lie, found by the tensor's name (the name must not occur
// earlier in the file).
struct TensorInfoFields {
  size_t num_dims;  // u32
  size_t dims;      // u64 × num_dims
  size_t type;      // u32
  size_t offset;    // u64
};
inline TensorInfoFields locate_tensor_info(const std::vector<uint8_t>& bytes,
                                           std::string_view name) {
  TensorInfoFields f{};
  f.num_dims = find_bytes(bytes, name) + name.size();
  f.dims = f.num_dims + 4;
  f.type = f.dims + 8 * peek<uint32_t>(bytes, f.num_dims);
  f.offset = f.type + 4;
  return f;
}

// Offset of the u32 type tag of a metadata key's value.
inline size_t locate_value_type(const std::vector<uint8_t>& bytes, std::string_view key) {
  return find_bytes(bytes, key) + key.size();
}

// Parses an exact-size heap copy of `bytes` (so that ASan flags any read past the end) and
// returns the FormatError's message; fails the test if parsing succeeds. Any other exception
// propagates and fails the test.
inline std::string parse_error(std::span<const uint8_t> bytes) {
  const std::vector<uint8_t> copy(bytes.begin(), bytes.end());
  try {
    File::parse(copy);
  } catch (const FormatError& e) {
    return e.what();
  }
  ADD_FAILURE() << "parsed " << bytes.size() << " bytes without error";
  return {};
}

// A fresh, empty folder for one test.
inline std::filesystem::path temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "sieve_gguf_test" /
                              (std::string(info->test_suite_name()) + "." + info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace sieve::gguf::testing
