#pragma once
// The JSON type of the server: request bodies, template contexts and responses.
#include <nlohmann/json.hpp>

#include <string>

namespace sieve::server {

using json = nlohmann::json;

// Compact JSON text as the server writes it: invalid UTF-8 in a string (a model's cut-off
// character) is replaced, never thrown on.
inline std::string dump_json(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace sieve::server
