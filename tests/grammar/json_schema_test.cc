#include "grammar/json_schema.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_cache.h"
#include "grammar/grammar_state.h"
#include "test_util.h"
#include "util/error.h"

namespace sieve::grammar {
namespace {

using Json = nlohmann::json;

// A validator for the subset json_schema.h supports; returns "" or what is wrong.
class Validator {
 public:
  explicit Validator(const Json& root) : root_(root) {}

  std::string check(const Json& x, const Json& s, const std::string& at = "$") const {
    if (s.is_boolean()) return s.get<bool>() ? "" : at + ": schema false";
    if (s.contains("$ref")) {
      const std::string ref = s["$ref"];
      return check(x, root_.at(Json::json_pointer(ref.substr(1))), at);
    }
    if (s.contains("nullable") && s["nullable"].get<bool>() && x.is_null()) return "";
    if (s.contains("const") && x != s["const"]) return at + ": not the const";
    if (s.contains("enum")) {
      bool found = false;
      for (const Json& v : s["enum"]) found = found || v == x;
      if (!found) return at + ": not in the enum";
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      int num_ok = 0;
      for (const Json& sub : s[key]) num_ok += check(x, sub, at).empty();
      if (num_ok == 0) return at + ": matches no " + key + " branch";
      if (std::string(key) == "oneOf" && num_ok > 1) return at + ": matches several oneOf";
    }
    if (s.contains("type")) {
      std::vector<std::string> types;
      if (s["type"].is_string()) {
        types.push_back(s["type"]);
      } else {
        for (const Json& t : s["type"]) types.push_back(t);
      }
      bool ok = false;
      for (const std::string& t : types) {
        ok = ok || (t == "string" && x.is_string()) || (t == "number" && x.is_number()) ||
             (t == "integer" && (x.is_number_integer())) || (t == "boolean" && x.is_boolean()) ||
             (t == "null" && x.is_null()) || (t == "object" && x.is_object()) ||
             (t == "array" && x.is_array());
      }
      if (!ok) return at + ": wrong type " + x.dump();
    }
    if (x.is_string()) {
      size_t n = 0;
      for (unsigned char c : x.get<std::string>()) n += (c & 0xC0) != 0x80;
      if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return at + ": too short";
      if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return at + ": too long";
    }
    if (x.is_array()) {
      if (s.contains("minItems") && x.size() < s["minItems"].get<size_t>()) return at + ": few";
      if (s.contains("maxItems") && x.size() > s["maxItems"].get<size_t>()) return at + ": many";
      if (s.contains("items")) {
        for (size_t i = 0; i < x.size(); ++i) {
          std::string e = check(x[i], s["items"], at + "[" + std::to_string(i) + "]");
          if (!e.empty()) return e;
        }
      }
    }
    if (x.is_object()) {
      const Json props = s.value("properties", Json::object());
      for (const Json& r : s.value("required", Json::array())) {
        if (!x.contains(r.get<std::string>())) return at + ": missing " + r.get<std::string>();
      }
      for (const auto& [key, value] : x.items()) {
        if (props.contains(key)) {
          std::string e = check(value, props[key], at + "." + key);
          if (!e.empty()) return e;
        } else if (s.contains("additionalProperties")) {
          std::string e = check(value, s["additionalProperties"], at + "." + key);
          if (!e.empty()) return e;
        } else if (s.contains("properties")) {
          return at + ": extra key " + key;
        }
      }
    }
    return "";
  }

 private:
  const Json& root_;
};

const char* const kSchemas[] = {
    R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"]})",
    R"({"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"},
        "c": {"type": "number"}}, "required": ["c"]})",
    R"({"type": "object", "properties": {"opt1": {"type": "integer"}, "opt2": {"type": "integer"},
        "opt3": {"type": "string", "maxLength": 3}}})",
    R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4})",
    R"({"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 5},
        "maxItems": 3})",
    R"({"type": "array", "items": {"type": "boolean"}, "minItems": 1})",
    R"({"enum": ["red", "green", "blue", 42, null, {"k": [1, 2]}]})",
    R"({"type": "object", "properties": {"kind": {"const": "circle"},
        "radius": {"type": "number"}}, "required": ["kind", "radius"],
        "additionalProperties": false})",
    R"({"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"x": {"type": "string"}},
        "required": ["x"]}]})",
    R"({"oneOf": [{"type": "string", "maxLength": 4}, {"type": "array", "items": {"type": "null"},
        "maxItems": 2}]})",
    R"({"type": ["string", "null"], "maxLength": 8})",
    R"({"type": "integer", "nullable": true})",
    R"({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"},
        "y": {"type": "integer"}}, "required": ["x", "y"]}},
        "type": "object", "properties": {"from": {"$ref": "#/$defs/point"},
        "to": {"$ref": "#/$defs/point"}}, "required": ["from", "to"]})",
    R"({"$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["value"]}}, "$ref": "#/$defs/node"})",
    R"({"definitions": {"list": {"anyOf": [{"type": "null"}, {"type": "object",
        "properties": {"head": {"type": "string", "maxLength": 2}, "tail": {"$ref": "#/definitions/list"}},
        "required": ["head", "tail"]}]}}, "$ref": "#/definitions/list"})",
    R"({"type": "object", "additionalProperties": {"type": "integer"}})",
    R"({"type": "object", "properties": {"id": {"type": "integer"}},
        "required": ["id"], "additionalProperties": true})",
    R"({"type": "object", "properties": {"tags": {"type": "array",
        "items": {"enum": ["a", "b", "c"]}, "maxItems": 5}}, "required": ["tags"]})",
    R"({"type": "object", "properties": {"user": {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 2, "maxLength": 10},
        "address": {"type": "object", "properties": {"city": {"type": "string"},
        "zip": {"type": "string", "minLength": 5, "maxLength": 5}}, "required": ["city"]}},
        "required": ["name", "address"]}}, "required": ["user"]})",
    R"({"type": "array", "items": {"type": "array", "items": {"type": "number"}, "maxItems": 3},
        "maxItems": 3})",
    R"({"title": "t", "description": "d", "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object", "properties": {"ok": {"type": "boolean", "description": "x"}},
        "required": ["ok"]})",
    R"({})",
    R"({"type": "object"})",
    R"({"type": "object", "properties": {"items": {"type": "array", "items": {
        "type": "object", "properties": {"sku": {"type": "string", "maxLength": 8},
        "qty": {"type": "integer"}, "price": {"type": ["number", "null"]}},
        "required": ["sku", "qty", "price"]}, "minItems": 1, "maxItems": 3},
        "status": {"enum": ["open", "paid", "shipped"]}}, "required": ["items", "status"]})",
    R"({"type": "string", "minLength": 3})",
    R"({"enum": ["ab", "abc", "abd", "a", 1, 12, 123, "é", "éa", [1], [1, 2], {"a": 1}, null]})",
};

// Random walks through the masks give JSON that parses and validates against the schema.
TEST(JsonSchema, RandomWalksProduceValidDocuments) {
  for (const char* vocab_name : testing::kVocabularies) {
    GrammarCache cache(testing::golden_vocabulary(vocab_name));
    std::mt19937 rng(11);
    for (size_t i = 0; i < std::size(kSchemas); ++i) {
      // A new schema walks the 102k-token trie cold (~70 ms); a third of them by default.
      const bool large = std::string(vocab_name) != "llama-spm";
      if (large && i % 3 != 0 && testing::fuzz_scale() == 1) continue;
      SCOPED_TRACE(std::string(vocab_name) + " schema " + std::to_string(i) + ": " + kSchemas[i]);
      const Json schema = Json::parse(kSchemas[i]);
      const auto masker = cache.get({GrammarKind::kJsonSchema, kSchemas[i]});
      const int num_walks = 3 * testing::fuzz_scale();
      int num_ended = 0;
      for (int walk = 0; walk < num_walks; ++walk) {
        const testing::WalkResult result = testing::random_walk(*masker, rng, 600, 40);
        if (!result.ended) continue;
        ++num_ended;
        Json doc;
        ASSERT_NO_THROW(doc = Json::parse(result.text)) << result.text;
        EXPECT_EQ(Validator(schema).check(doc, schema), "") << result.text;
      }
      EXPECT_GT(num_ended, 0);
    }
  }
}

// An enum runs as a trie of its values: hundreds of values that share their first characters
// (country names, codes) are one parse per branch, not one per value (as alternatives, over 128
// values was "grammar too ambiguous"). Exactly the values match.
TEST(JsonSchema, EnumsOfManyValuesMatchExactlyTheirValues) {
  Json values = Json::array();
  std::vector<std::string> texts;
  for (int i = 0; i < 1000; ++i) values.push_back(fmt::format("value{}", i));  // shared prefix
  for (int i = 0; i < 300; ++i) values.push_back(i * 7);                       // 0, 7, 14, 21 ...
  for (const char* v : {"", "x", "xy", "xyz", "Ünïcödé", "Ünï", "日本", "日本語"})
    values.push_back(v);
  values.push_back(nullptr);
  values.push_back(Json::parse(R"({"k": [1, 2]})"));
  for (const Json& v : values) texts.push_back(v.dump());
  Json schema = {{"enum", values}};
  const auto g = CompiledGrammar::from_gbnf(json_schema_to_gbnf(schema.dump()));
  const auto matches = [&](const std::string& text) {
    GrammarState state(g);
    return state.accept_bytes(text) && state.can_end();
  };
  for (const std::string& text : texts) EXPECT_TRUE(matches(text)) << text;
  for (const std::string text :
       {"\"value\"", "\"value1000\"", "\"value12x\"", "\"valu\"", "1", "71", "2100", "\"xyzz\"",
        "\"Ün\"", "\"日\"", "nul", "{\"k\":[1]}", "\"x\" "}) {
    EXPECT_FALSE(matches(text)) << text;
  }
  // A union of Literals as Pydantic writes it (anyOf of consts and enums): the same trie.
  Json branches = Json::array();
  for (int i = 0; i < 300; ++i)
    branches.push_back({{"const", fmt::format("v{}", i)}, {"title", "t"}});
  branches.push_back({{"enum", {"w", "w2"}}});
  const auto g3 = CompiledGrammar::from_gbnf(json_schema_to_gbnf(Json{{"anyOf", branches}}.dump()));
  for (const std::string text : {"\"v0\"", "\"v299\"", "\"w\"", "\"w2\""}) {
    GrammarState state(g3);
    EXPECT_TRUE(state.accept_bytes(text) && state.can_end()) << text;
  }
  for (const std::string text : {"\"v300\"", "\"w3\"", "\"v\""}) {
    GrammarState state(g3);
    EXPECT_FALSE(state.accept_bytes(text) && state.can_end()) << text;
  }
  // As an object's property (values followed by more of the document), and 10^5 of them.
  Json many = Json::array();
  for (int i = 0; i < 100000; ++i) many.push_back(fmt::format("id-{}", i * 13));
  Json object = {{"type", "object"},
                 {"properties", {{"id", {{"enum", many}}}, {"n", {{"type", "integer"}}}}},
                 {"required", {"id", "n"}}};
  const auto g2 = CompiledGrammar::from_gbnf(json_schema_to_gbnf(object.dump()));
  GrammarState state(g2);
  EXPECT_TRUE(state.accept_bytes(R"({"id": "id-1299987", "n": 5})") && state.can_end());
  GrammarState wrong(g2);
  EXPECT_FALSE(wrong.accept_bytes(R"({"id": "id-1299988")"));
}

TEST(JsonSchema, JsonObjectIsAnyObject) {
  GrammarCache cache(testing::golden_vocabulary("llama-spm"));
  const auto masker = cache.get({GrammarKind::kJsonObject, ""});
  std::mt19937 rng(3);
  const int num_walks = 10 * testing::fuzz_scale();
  int num_ended = 0;
  for (int walk = 0; walk < num_walks; ++walk) {
    const testing::WalkResult result = testing::random_walk(*masker, rng, 600, 40);
    if (!result.ended) continue;  // the walk's own checks covered every step
    ++num_ended;
    Json doc;
    ASSERT_NO_THROW(doc = Json::parse(result.text)) << result.text;
    EXPECT_TRUE(doc.is_object()) << result.text;
  }
  std::printf("%d of %d walks ended\n", num_ended, num_walks);
  EXPECT_GE(num_ended, num_walks / 2) << "too few objects ended to check them whole";
  for (const char* text : {"{}", "{ \"a\" : [1, -2.5e+3, true, null, \"x\\u00e9\"] }"}) {
    GrammarState state = masker->new_state();
    EXPECT_TRUE(state.accept_bytes(text) && state.can_end()) << text;
  }
  for (const char* text : {" {}", "[]", "{\"a\" 1}", "{\"\\ud800\": 1}", "{\"a\":01}"}) {
    GrammarState state = masker->new_state();
    EXPECT_FALSE(state.accept_bytes(text) && state.can_end()) << text;
  }
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  struct Case {
    const char* schema;
    const char* expected;
  };
  const Case cases[] = {
      {R"({"type": "string", "pattern": "^a"})", "unsupported keyword 'pattern' at '#/pattern'"},
      {R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}})",
       "unsupported keyword 'minimum' at '#/properties/n/minimum'"},
      {R"({"allOf": [{"type": "string"}]})", "unsupported keyword 'allOf'"},
      {R"({"type": "string", "format": "date"})", "unsupported keyword 'format'"},
      {R"({"patternProperties": {}})", "unsupported keyword 'patternProperties'"},
      {R"({"type": "array", "prefixItems": []})", "unsupported keyword 'prefixItems'"},
      {R"({"type": "strin"})", "unknown type 'strin'"},
      {R"({"$ref": "https://example.com/s.json"})", "only local '$ref'"},
      {R"({"$ref": "#/$defs/missing"})", "points to nothing"},
      {R"({"type": "object", "properties": {}, "required": ["x"]})",
       "required property 'x' is not in 'properties'"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "'maxItems' below 'minItems'"},
      {R"({"type": "array", "minItems": -1})", "'minItems' must be a non-negative integer"},
      {R"({"type": )", "not valid JSON"},
      {R"(false)", "schema 'false' matches nothing"},
      {R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})", "can never finish"},
  };
  // What the compiler walks recursively is bounded: the schemas' nesting (each $ref followed
  // counts) and the document's.
  std::string nested;
  for (int i = 0; i < 300; ++i) nested += R"({"type": "array", "items": )";
  nested += R"({"type": "string"})" + std::string(300, '}');
  std::string chain = R"({"$defs": {)";
  for (int i = 0; i < 100000; ++i)
    chain += fmt::format(R"("d{}": {{"$ref": "#/$defs/d{}"}}, )", i, i + 1);
  chain += R"("d100000": {"type": "string"}}, "$ref": "#/$defs/d0"})";
  const std::string deep_value =
      R"({"const": )" + std::string(600, '[') + std::string(600, ']') + "}";
  const std::vector<Case> limits = {
      {nested.c_str(), "schemas nest deeper than 256 levels (counting each $ref followed) at '#"},
      {chain.c_str(),
       "schemas nest deeper than 256 levels (counting each $ref followed) at '#/$defs/d255'"},
      {deep_value.c_str(), "JSON schema: arrays and objects nest deeper than 512 levels"},
  };
  GrammarCache cache(testing::golden_vocabulary("llama-spm"));
  std::vector<Case> all(std::begin(cases), std::end(cases));
  all.insert(all.end(), limits.begin(), limits.end());
  for (const Case& c : all) {
    std::string error;
    try {
      cache.get({GrammarKind::kJsonSchema, c.schema});
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find(c.expected), std::string::npos)
        << c.schema << "\nerror: " << error << "\nexpected: " << c.expected;
  }
}

TEST(JsonSchema, OrderedPropertiesAndOptionalCommas) {
  const auto g = CompiledGrammar::from_gbnf(json_schema_to_gbnf(
      R"({"properties": {"b": {"type": "integer"}, "a": {"type": "integer"},
          "c": {"type": "integer"}}, "required": ["a"]})"));
  auto ok = [&](const char* text) {
    GrammarState state(g);
    return state.accept_bytes(text) && state.can_end();
  };
  EXPECT_TRUE(ok(R"({"a":1})"));
  EXPECT_TRUE(ok(R"({"b":1,"a":2})"));
  EXPECT_TRUE(ok(R"({"a":2,"c":3})"));
  EXPECT_TRUE(ok("{\n  \"b\": 1,\n  \"a\": 2,\n  \"c\": 3\n}"));
  EXPECT_FALSE(ok(R"({"a":1,"b":2})"));  // declared order
  EXPECT_FALSE(ok(R"({"b":1})"));        // a is required
  EXPECT_FALSE(ok(R"({,"a":1})"));
  EXPECT_FALSE(ok(R"({"a":1,})"));
  EXPECT_FALSE(ok(R"({"a":1,"d":1})"));
}

TEST(JsonSchema, CacheCompilesEachSchemaOnceAcrossThreads) {
  GrammarCache cache(testing::golden_vocabulary("llama-spm"), /*capacity=*/2);
  const std::string a = R"({"type": "integer"})";
  const std::string a_spaced = "{ \"type\" :\n \"integer\" }";
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<const TokenMasker>> got(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      got[t] = cache.get({GrammarKind::kJsonSchema, t % 2 ? a : a_spaced});
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 1; t < 4; ++t) EXPECT_EQ(got[t], got[0]);
  EXPECT_EQ(cache.size(), 1u);
  cache.get({GrammarKind::kJsonSchema, R"({"type": "string"})"});
  cache.get({GrammarKind::kJsonObject, ""});
  EXPECT_EQ(cache.size(), 2u);  // the integer schema, least recently used, went
  const size_t compiled = cache.num_compiled();
  cache.get({GrammarKind::kJsonObject, ""});
  EXPECT_EQ(cache.num_compiled(), compiled);
}

}  // namespace
}  // namespace sieve::grammar
