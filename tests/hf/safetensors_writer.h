#pragma once
// Writes safetensors files by hand for tests: an 8-byte little-endian header length, the JSON
// header, the tensors' bytes in order.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "error_of.h"

namespace sieve::testing {

struct StTensor {
  std::string name;
  std::string dtype;            // "F32", "F16", "BF16", ...
  std::vector<uint64_t> shape;  // row-major
  std::vector<uint8_t> data;
};

inline std::vector<uint8_t> header_and_data(const std::string& header,
                                            const std::vector<uint8_t>& data) {
  std::vector<uint8_t> bytes(8);
  const uint64_t size = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(size >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

inline std::vector<uint8_t> safetensors_bytes(const std::vector<StTensor>& tensors,
                                              const nlohmann::json& metadata = nullptr) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  std::vector<uint8_t> data;
  for (const StTensor& tensor : tensors) {
    header[tensor.name] = {{"dtype", tensor.dtype},
                           {"shape", tensor.shape},
                           {"data_offsets", {data.size(), data.size() + tensor.data.size()}}};
    data.insert(data.end(), tensor.data.begin(), tensor.data.end());
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // as HF pads it: data 8-byte aligned
  return header_and_data(text, data);
}

inline void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

}  // namespace sieve::testing
