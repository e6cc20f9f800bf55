#include "hf/safetensors.h"

#include "hf/json_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace sieve::hf {

namespace {

using nlohmann::json;

struct DTypeName {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr std::array kDTypes = {
    DTypeName{DType::kF64, "F64", 8},        DTypeName{DType::kF32, "F32", 4},
    DTypeName{DType::kF16, "F16", 2},        DTypeName{DType::kBF16, "BF16", 2},
    DTypeName{DType::kI64, "I64", 8},        DTypeName{DType::kI32, "I32", 4},
    DTypeName{DType::kI16, "I16", 2},        DTypeName{DType::kI8, "I8", 1},
    DTypeName{DType::kU64, "U64", 8},        DTypeName{DType::kU32, "U32", 4},
    DTypeName{DType::kU16, "U16", 2},        DTypeName{DType::kU8, "U8", 1},
    DTypeName{DType::kBool, "BOOL", 1},      DTypeName{DType::kF8E4M3, "F8_E4M3", 1},
    DTypeName{DType::kF8E5M2, "F8_E5M2", 1},
};

const DTypeName& describe(DType dtype) {
  for (const DTypeName& entry : kDTypes) {
    if (entry.dtype == dtype) return entry;
  }
  return kDTypes[0];  // unreachable: every enumerator is in the table
}

json parse_header_json(std::string_view text, const std::string& label) {
  return parse_json(text, label, "safetensors header");
}

uint64_t read_u64_field(const json& value, const std::string& label, const std::string& tensor,
                        std::string_view what) {
  // Floats (1e30), negatives and integers beyond uint64 are refused, not rounded.
  if (!value.is_number_unsigned()) {
    fail("{}: tensor '{}' has {} {}, expected a non-negative integer", label, tensor, what,
         value.dump());
  }
  return value.get<uint64_t>();
}

TensorInfo read_tensor(const std::string& name, const json& entry, const std::string& label) {
  if (!entry.is_object()) fail("{}: tensor '{}' is not a JSON object", label, name);
  TensorInfo info;
  info.name = name;
  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string())
    fail("{}: tensor '{}' has no \"dtype\" string", label, name);
  const std::string dtype_name = dtype_it->get<std::string>();
  const std::optional<DType> dtype = parse_dtype(dtype_name);
  if (!dtype) fail("{}: tensor '{}' has unknown dtype '{}'", label, name, dtype_name);
  info.dtype = *dtype;

  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array())
    fail("{}: tensor '{}' has no \"shape\" array", label, name);
  if (shape_it->size() > 8)
    fail("{}: tensor '{}' has {} dimensions", label, name, shape_it->size());
  // Element count with overflow checked: a product past 2^62 cannot fit in any file.
  uint64_t num_elements = 1;
  for (const json& dim : *shape_it) {
    const uint64_t size = read_u64_field(dim, label, name, "shape dimension");
    if (size != 0 && num_elements > (uint64_t{1} << 60) / size)
      fail("{}: tensor '{}' has a shape too large for any file", label, name);
    num_elements *= size;
    info.shape.push_back(size);
  }
  const auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2)
    fail("{}: tensor '{}' has no \"data_offsets\" pair", label, name);
  info.begin = read_u64_field((*offsets_it)[0], label, name, "data offset");
  info.end = read_u64_field((*offsets_it)[1], label, name, "data offset");
  if (info.end < info.begin) {
    fail("{}: tensor '{}' has data_offsets [{}, {}] that end before they begin", label, name,
         info.begin, info.end);
  }
  const uint64_t expected = num_elements * dtype_size(info.dtype);  // <= 2^63: no overflow
  if (info.end - info.begin != expected) {
    fail("{}: tensor '{}' ({} of shape {}) needs {} bytes, its data_offsets [{}, {}] hold {}",
         label, name, dtype_name, shape_it->dump(), expected, info.begin, info.end,
         info.end - info.begin);
  }
  for (const auto& [key, value] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      fail("{}: tensor '{}' has unknown field '{}'", label, name, key);
  }
  return info;
}

}  // namespace

std::string_view to_string(DType dtype) { return describe(dtype).name; }
size_t dtype_size(DType dtype) { return describe(dtype).size; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (const DTypeName& entry : kDTypes) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

uint64_t TensorInfo::num_elements() const {
  uint64_t count = 1;
  for (uint64_t size : shape) count *= size;
  return count;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  MappedFile mapping = MappedFile::open(path);
  SafetensorsFile file = parse(mapping.bytes(), path);
  // The mapping's address does not change when it is moved, so the spans stay valid.
  file.mapping_ = std::move(mapping);
  return file;
}

SafetensorsFile SafetensorsFile::parse(std::span<const uint8_t> bytes, std::string label) {
  SafetensorsFile file;
  file.label_ = std::move(label);
  const std::string& name = file.label_;
  if (bytes.size() < 8) {
    fail("{}: truncated safetensors file ({} bytes; the header length alone takes 8)", name,
         bytes.size());
  }
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | bytes[i];
  if (header_size > bytes.size() - 8) {
    fail(
        "{}: safetensors header length {} runs past the end of the file ({} bytes): truncated or "
        "not a safetensors file",
        name, header_size, bytes.size());
  }
  if (header_size > kMaxHeaderBytes)
    fail("{}: safetensors header of {} bytes is over the {} byte limit", name, header_size,
         kMaxHeaderBytes);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), header_size);
  const json header = parse_header_json(text, name);
  if (!header.is_object()) fail("{}: safetensors header is not a JSON object", name);
  file.data_ = bytes.subspan(8 + header_size);

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail("{}: \"__metadata__\" is not a JSON object", name);
      for (const auto& [meta_key, meta_value] : value.items()) {
        if (!meta_value.is_string())
          fail("{}: \"__metadata__\" value of '{}' is not a string", name, meta_key);
        file.metadata_[meta_key] = meta_value.get<std::string>();
      }
      continue;
    }
    file.tensors_.push_back(read_tensor(key, value, name));
  }
  // The tensors must tile the data section: sorted by offset, each begins where the previous
  // ended, the last ends at the end of the file.
  std::sort(file.tensors_.begin(), file.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  uint64_t cursor = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& tensor : file.tensors_) {
    if (tensor.end > file.data_.size()) {
      fail(
          "{}: tensor '{}' has data_offsets [{}, {}] past the end of the data ({} bytes): "
          "truncated file",
          name, tensor.name, tensor.begin, tensor.end, file.data_.size());
    }
    if (tensor.begin < cursor) {
      fail("{}: tensors '{}' and '{}' overlap (data_offsets [{}, {}] and [{}, {}])", name,
           previous->name, tensor.name, previous->begin, previous->end, tensor.begin, tensor.end);
    }
    if (tensor.begin > cursor)
      fail("{}: {} unused bytes before tensor '{}' at offset {}", name, tensor.begin - cursor,
           tensor.name, tensor.begin);
    cursor = tensor.end;
    previous = &tensor;
  }
  if (cursor != file.data_.size()) {
    fail("{}: {} bytes after the last tensor's data; the header does not describe the file", name,
         file.data_.size() - cursor);
  }
  for (size_t i = 0; i < file.tensors_.size(); ++i) file.index_.emplace(file.tensors_[i].name, i);
  return file;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> SafetensorsFile::data(const TensorInfo& tensor) const {
  // Re-checked so that a TensorInfo from another file cannot read out of bounds.
  if (tensor.end > data_.size() || tensor.begin > tensor.end)
    fail("{}: tensor '{}' does not lie inside this file", label_, tensor.name);
  return data_.subspan(tensor.begin, tensor.end - tensor.begin);
}

namespace {

constexpr std::string_view kIndexName = "model.safetensors.index.json";
constexpr std::string_view kSingleName = "model.safetensors";

// The shard file names of an index, in first-use order, and which holds each tensor.
struct ShardIndex {
  std::vector<std::string> shards;
  std::map<std::string, size_t> tensor_shard;
};

ShardIndex read_index(const std::string& path) {
  const json index = read_json_file(path);
  const auto map_it = index.is_object() ? index.find("weight_map") : index.end();
  if (map_it == index.end() || !map_it->is_object())
    fail("{}: no \"weight_map\" object naming each tensor's file", path);
  ShardIndex result;
  std::map<std::string, size_t> shard_ids;
  for (const auto& [tensor, shard] : map_it->items()) {
    if (!shard.is_string()) fail("{}: weight_map entry '{}' is not a file name", path, tensor);
    const std::string file = shard.get<std::string>();
    // Shards live beside the index: a path would let a downloaded folder read other files.
    if (file.empty() || file.find('/') != std::string::npos ||
        file.find('\\') != std::string::npos || file == "." || file == "..") {
      fail("{}: weight_map entry '{}' names '{}', which is not a file name in the model's folder",
           path, tensor, file);
    }
    auto [it, added] = shard_ids.emplace(file, result.shards.size());
    if (added) result.shards.push_back(file);
    result.tensor_shard[tensor] = it->second;
  }
  return result;
}

}  // namespace

SafetensorsSet SafetensorsSet::open(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::path target(path);
  if (fs::is_directory(target, error)) {
    if (fs::exists(target / kIndexName)) {
      target /= kIndexName;
    } else if (fs::exists(target / kSingleName)) {
      target /= kSingleName;
    } else {
      std::vector<fs::path> found;
      for (const auto& entry : fs::directory_iterator(target, error)) {
        if (entry.path().extension() == ".safetensors") found.push_back(entry.path());
      }
      if (found.size() != 1) {
        fail("'{}' holds {} *.safetensors files and no {}: cannot tell which are the model's", path,
             found.size(), kIndexName);
      }
      target = found[0];
    }
  }
  SafetensorsSet set;
  if (target.extension() == ".json") {
    const ShardIndex index = read_index(target.string());
    for (const std::string& shard : index.shards) {
      const fs::path shard_path = target.parent_path() / shard;
      if (!fs::exists(shard_path)) {
        fail("missing shard '{}' (named by {})", shard_path.string(), target.string());
      }
      set.files_.push_back(
          std::make_shared<const SafetensorsFile>(SafetensorsFile::open(shard_path.string())));
    }
    for (const auto& [tensor, shard] : index.tensor_shard) {
      const TensorInfo* info = set.files_[shard]->find(tensor);
      if (info == nullptr) {
        fail("{} names tensor '{}' in '{}', which does not hold it", target.string(), tensor,
             set.files_[shard]->path());
      }
      set.index_.emplace(tensor, std::pair{shard, info});
    }
    return set;
  }
  set.files_.push_back(
      std::make_shared<const SafetensorsFile>(SafetensorsFile::open(target.string())));
  for (const TensorInfo& info : set.files_[0]->tensors()) {
    set.index_.emplace(info.name, std::pair{size_t{0}, &info});
  }
  return set;
}

std::optional<SafetensorsSet::Tensor> SafetensorsSet::find(std::string_view name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) return std::nullopt;
  const auto& [file, info] = it->second;
  return Tensor{info, files_[file]->data(*info), &files_[file]->path()};
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> list;
  for (const auto& [name, where] : index_) list.push_back(name);
  return list;
}

}  // namespace sieve::hf
