#pragma once
// The JSON type of the server: request bodies, template contexts and responses.
//
// Objects keep their keys in the order they came (nlohmann::ordered_json): a schema's declared
// property order is the order of the output it constrains, a tool's parameters reach the chat
// template as the client wrote them (transformers does the same), and responses list their
// fields in the order they are built. A key given twice keeps its first place and its last value
// (util/json_text.h).
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>

#include "util/json_text.h"

namespace sieve::server {

using json = nlohmann::ordered_json;

// The deepest nesting of arrays and objects parse_json takes: request bodies and a model's
// tool-call JSON come from outside, and what walks a document recurses once per level
// (util/json_text.h). No OpenAI request nests nearly this deep (OpenAI's strict schemas allow 10
// levels).
inline constexpr size_t kMaxJsonDepth = 128;

// Why parse_json gave nothing: kInvalid or kTooDeep (kOk is never set).
using JsonError = JsonParse::Status;

// JSON text → json, in time linear in its size (util/json_text.h); nullopt when it is not valid
// JSON (UTF-8) or nests deeper than kMaxJsonDepth (which of the two in *error, when given).
std::optional<json> parse_json(std::string_view text, JsonError* error = nullptr);

// Compact JSON text as the server writes it: invalid UTF-8 in a string (a model's cut-off
// character) is replaced, never thrown on.
inline std::string dump_json(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace sieve::server
