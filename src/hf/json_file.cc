#include "hf/json_file.h"

#include <filesystem>
#include <fstream>

#include "util/error.h"

namespace sieve::hf {

using nlohmann::json;

json parse_json(std::string_view text, const std::string& label, std::string_view what) {
  const json::parser_callback_t limit_depth = [&](int depth, json::parse_event_t, json&) {
    if (depth > kMaxJsonDepth)
      fail("{}: {} nests deeper than {} levels", label, what, kMaxJsonDepth);
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), limit_depth);
  } catch (const json::exception& e) {
    fail("{}: {} is not valid JSON: {}", label, what, e.what());
  }
}

json read_json_file(const std::string& path) {
  std::error_code error;
  const uint64_t size = std::filesystem::file_size(path, error);
  if (error) fail("cannot read '{}': {}", path, error.message());
  if (size > kMaxJsonFileBytes)
    fail("'{}' is {} bytes, over the {} byte limit", path, size, kMaxJsonFileBytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open '{}'", path);
  std::string text(size, '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (static_cast<uint64_t>(in.gcount()) != size) fail("cannot read '{}'", path);
  return parse_json(text, path, "the file");
}

}  // namespace sieve::hf
