#pragma once
// JSON from files a downloaded model folder holds (safetensors headers, config.json, indexes):
// bounded in size and nesting, errors naming the file.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace sieve::hf {

// JSON nesting deeper than this is refused while parsing (a safetensors header needs 3 levels,
// config.json and tokenizer.json a handful).
inline constexpr int kMaxJsonDepth = 32;
// The largest JSON file read (tokenizer.json of a 256k vocabulary is ~20 MB).
inline constexpr uint64_t kMaxJsonFileBytes = uint64_t{100} << 20;

// Parses `text`; a syntax error or nesting past kMaxJsonDepth is a sieve::Error "<label>: <what>
// ...". nlohmann's parser is iterative, but a deeply nested value would still cost memory and a
// recursive destruction, so it is refused before it is built.
nlohmann::json parse_json(std::string_view text, const std::string& label, std::string_view what);
// Reads and parses a JSON file (at most kMaxJsonFileBytes).
nlohmann::json read_json_file(const std::string& path);

}  // namespace sieve::hf
