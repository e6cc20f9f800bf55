#include "server/json.h"

namespace sieve::server {

std::optional<json> parse_json(std::string_view text, JsonError* error) {
  JsonParse parsed = parse_ordered_json(text, kMaxJsonDepth);
  if (parsed.ok()) return std::move(parsed.value);
  if (error != nullptr) *error = parsed.status;
  return std::nullopt;
}

}  // namespace sieve::server
