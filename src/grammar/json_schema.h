#pragma once
// JSON grammars for response_format: any JSON object (`json_object`) and JSON Schema
// (`json_schema`), compiled to GBNF text (grammar.h), which parse_gbnf then compiles.
//
// Supported JSON Schema subset (anything else is an error naming the keyword, for a 400):
//   type (a name or an array of names; "nullable": true adds null), properties, required,
//   additionalProperties (false / true / a schema), items, minItems, maxItems, enum, const,
//   anyOf, oneOf (treated as anyOf: exclusivity is not enforced), minLength, maxLength (strings),
//   $ref to "#", "#/$defs/..", "#/definitions/.." or any local JSON pointer (recursion is fine),
//   and annotations that change nothing (title, description, default, examples, $schema, $id,
//   $comment, $defs, definitions, strict).
//   `true` / {} is any JSON value; `false` is an error.
//
// Output shape:
//   - Properties come in the order the schema declares them; optional ones may be left out.
//     Without additionalProperties, an object with `properties` takes no other keys (OpenAI's
//     strict mode); one without `properties` takes any keys. Extra keys (additionalProperties
//     true or a schema) come after the declared ones and are not checked against their names.
//   - Whitespace: none before the first and after the last character; between tokens nothing,
//     one space, or a newline and up to 20 spaces or tabs of indentation (llama.cpp's rule:
//     enough to pretty-print, never a run of blank lines that a small model can fall into).
//   - Numbers: integers of at most 16 digits; fractions of at most 16 digits; exponents of at
//     most 2 (doubles never overflow). Strings: JSON escapes, but no \uD800-\uDFFF (so no
//     surrogate pairs: characters beyond U+FFFF come as UTF-8); no raw control characters. A
//     string's length (minLength/maxLength) counts characters, an escape being one.
//   - enum/const values are written compactly (nlohmann's dump(): no spaces). An enum is a trie
//     of its values' texts (a rule where they branch), so the automaton keeps one parse per
//     branch, not one per value: hundreds of values sharing a prefix run as fast as a few. An
//     anyOf / oneOf whose branches are all consts and enums is one such trie.
#include <string>
#include <string_view>

#include "util/json_text.h"

namespace sieve::grammar {

// GBNF for any JSON object; `root` is the object.
std::string json_object_gbnf();

// The schema's JSON text parsed as json_schema_to_gbnf reads it (key order kept, linear time,
// nesting limited); throws sieve::Error when it is not valid JSON or nests too deep.
JsonParse parse_schema(std::string_view schema_json);

// GBNF for documents valid under the schema (JSON text). Throws sieve::Error naming the keyword
// and where it is (a JSON pointer) when the schema uses something unsupported or is malformed.
std::string json_schema_to_gbnf(std::string_view schema_json);

}  // namespace sieve::grammar
