#pragma once
// The JSON type of the server: request bodies, template contexts and responses.
//
// Objects keep their keys in the order they came (nlohmann::ordered_json): a schema's declared
// property order is the order of the output it constrains, a tool's parameters reach the chat
// template as the client wrote them (transformers does the same), and responses list their
// fields in the order they are built. A key given twice in one object keeps its first place and
// its last value, as Python's json module (OpenAI's and vLLM's servers) reads it.
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace sieve::server {

using json = nlohmann::ordered_json;

// JSON text → json, in time linear in its size (nlohmann's own ordered parse looks every key up
// by a scan of its object: quadratic in the number of keys); nullopt when it is not valid JSON
// (UTF-8).
std::optional<json> parse_json(std::string_view text);

// Compact JSON text as the server writes it: invalid UTF-8 in a string (a model's cut-off
// character) is replaced, never thrown on.
inline std::string dump_json(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace sieve::server
