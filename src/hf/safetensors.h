#pragma once
// safetensors files (Hugging Face's weight format): a validating, memory-mapped reader, for one
// file or a sharded set (model.safetensors.index.json).
//
// File layout:
//   u64 little-endian N | N bytes of JSON header | data
//   header: { "<tensor name>": {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin,
//   end]}, ..., optional "__metadata__": {string: string} }
//   data_offsets are relative to the start of the data; the tensors tile the data exactly (no
//   overlap, no hole, nothing after the last one). Shapes are row-major: shape[0] is the
//   slowest-varying dimension (the reverse of ggml's order).
//
// Every length, offset and shape is checked against the file before use, and the JSON header is
// parsed with a nesting limit: a truncated or hostile file is a sieve::Error naming the file and
// what was wrong, never an out-of-bounds read or an unbounded allocation.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "util/error.h"
#include "util/mapped_file.h"

namespace sieve::hf {

// Every dtype the format defines (sizes known, so any well-formed file can be checked); only
// the float ones below are weights sieve reads.
enum class DType : uint8_t {
  kF64,
  kF32,
  kF16,
  kBF16,
  kI64,
  kI32,
  kI16,
  kI8,
  kU64,
  kU32,
  kU16,
  kU8,
  kBool,
  kF8E4M3,
  kF8E5M2,
};
std::string_view to_string(DType dtype);  // as the header spells it: "BF16"
size_t dtype_size(DType dtype);           // bytes per element
std::optional<DType> parse_dtype(std::string_view name);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<uint64_t> shape;  // row-major: shape.back() is contiguous
  uint64_t begin = 0, end = 0;  // byte range in the data section
  uint64_t num_elements() const;
};

// The largest header sieve reads (the format's reference implementation also stops at 100 MB).
inline constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

class SafetensorsFile {
 public:
  // Maps and validates the file. Errors name `path`.
  static SafetensorsFile open(const std::string& path);
  // Validates bytes the caller keeps alive for the object's lifetime (tests, fuzzing); errors
  // name `label`.
  static SafetensorsFile parse(std::span<const uint8_t> bytes, std::string label);

  const std::string& path() const { return label_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in data order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(std::string_view name) const;
  std::span<const uint8_t> data(const TensorInfo& tensor) const;

 private:
  MappedFile mapping_;  // empty when parsed from caller-owned bytes
  std::string label_;
  std::span<const uint8_t> data_;  // the data section
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  std::unordered_map<std::string, size_t> index_;
};

// A model's tensors across one file or the shards an index names.
class SafetensorsSet {
 public:
  // `path`: a .safetensors file, a model.safetensors.index.json, or a folder holding one of
  // them (model.safetensors.index.json is preferred, then model.safetensors, then the folder's
  // only *.safetensors file). Shards are named in the index by plain file names in its folder;
  // a missing or unreadable shard, a tensor the index names that its shard lacks, or a name in
  // two files is an error naming the file.
  static SafetensorsSet open(const std::string& path);

  struct Tensor {
    const TensorInfo* info;
    std::span<const uint8_t> data;
    const std::string* file;  // which file it lives in (for error messages)
  };
  std::optional<Tensor> find(std::string_view name) const;
  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  const std::vector<std::shared_ptr<const SafetensorsFile>>& files() const { return files_; }

 private:
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, std::pair<size_t, const TensorInfo*>, std::less<>> index_;
};

}  // namespace sieve::hf
