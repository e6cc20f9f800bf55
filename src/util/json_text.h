#pragma once
// JSON text from outside (request bodies, schemas, a model's tool-call output) into
// nlohmann::ordered_json, which keeps each object's keys in the order they came.
//
// Two guards that nlohmann's own ordered_json::parse lacks:
// - time linear in the text: ordered_json places each key by a scan of its object, so one object
//   of 10^5 keys (a 3 MB body) takes ~10^10 steps; here each open object has a hash index;
// - a depth limit: what walks a document afterwards (schema compilers, template contexts,
//   nlohmann's copies and dumps) recurses once per level, and 10^5 levels overflow a thread's
//   stack.
// A key given twice in one object keeps its first place and its last value, as Python's json
// module (OpenAI's and vLLM's servers) reads it.
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace sieve {

struct JsonParse {
  enum class Status { kOk, kInvalid, kTooDeep };
  Status status = Status::kInvalid;
  nlohmann::ordered_json value;  // kOk: the document
  std::string error;             // kInvalid: nlohmann's message (where and what)
  bool ok() const { return status == Status::kOk; }
};

// Parses UTF-8 JSON text; arrays and objects may nest at most max_depth levels.
JsonParse parse_ordered_json(std::string_view text, size_t max_depth);

}  // namespace sieve
