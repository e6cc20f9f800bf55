#pragma once
// The JSON Schema the grammar benchmarks share: an order, as an extraction pipeline might ask for
// (nested objects, arrays of objects, enums, optional and nullable fields).
namespace sieve::bench {

inline constexpr const char* kOrderSchema = R"({
  "type": "object",
  "properties": {
    "id": {"type": "integer"},
    "customer": {"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 64},
      "email": {"type": "string"},
      "tier": {"enum": ["free", "pro", "enterprise"]}}, "required": ["name", "email", "tier"]},
    "items": {"type": "array", "items": {"type": "object", "properties": {
      "sku": {"type": "string"}, "qty": {"type": "integer"}, "price": {"type": "number"},
      "note": {"type": ["string", "null"]}}, "required": ["sku", "qty", "price"]},
      "minItems": 1, "maxItems": 20},
    "paid": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string"}}
  },
  "required": ["id", "customer", "items", "paid"],
  "additionalProperties": false
})";

}  // namespace sieve::bench
