#include "grammar/json_schema.h"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "grammar/grammar.h"
#include "util/error.h"
#include "util/json_text.h"

namespace sieve::grammar {
namespace {

using Json = nlohmann::ordered_json;

// The primitives; `value`, `object` and `array` are any JSON value, object and array.
constexpr const char* kPrimitives = R"(ws ::= ( " " | "\n" [ \t]{0,20} )?
string ::= "\"" char* "\""
char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" hex-no-surrogate )
hex-no-surrogate ::= ( [0-9a-cA-CeEfF] [0-9a-fA-F] | [dD] [0-7] ) [0-9a-fA-F]{2}
integer ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
number ::= integer ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?
boolean ::= "true" | "false"
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
)";

const std::set<std::string> kAnnotations = {"title",       "description", "default",  "examples",
                                            "$schema",     "$id",         "$comment", "$defs",
                                            "definitions", "strict"};
const std::set<std::string> kKeywords = {
    "type",      "properties", "required", "additionalProperties",
    "items",     "minItems",   "maxItems", "enum",
    "const",     "anyOf",      "oneOf",    "minLength",
    "maxLength", "$ref",       "nullable"};

std::string literal(const Json& value) { return "\"" + escape_gbnf_literal(value.dump()) + "\""; }

class SchemaCompiler {
 public:
  // Each schema inside another (items, properties, anyOf ...) and each $ref followed is a nested
  // call of visit: a schema deeper than this, or a chain of $refs longer, is refused rather than
  // left to overflow the stack.
  static constexpr int kMaxNesting = 256;

  explicit SchemaCompiler(Json root) : root_(std::move(root)) {}

  std::string compile() {
    const std::string body = visit(root_, "");
    std::string out = "root ::= " + body + "\n";
    for (const std::string& rule : rules_) out += rule + "\n";
    out += kPrimitives;
    return out;
  }

 private:
  [[noreturn]] static void error(const std::string& path, const std::string& what) {
    fail("JSON schema: {} at '{}'", what, path.empty() ? "#" : "#" + path);
  }

  std::string new_rule(const std::string& hint, const std::string& body) {
    const std::string name = reserve_name(hint);
    rules_.push_back(name + " ::= " + body);
    return name;
  }
  std::string reserve_name(const std::string& hint) {
    std::string base;
    for (char c : hint) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      base += ok ? c : '-';
    }
    if (base.empty() || base.size() > 40) base = "s";
    base = "s-" + base;
    std::string name = base;
    // Numbered from where the base's last name stopped: an enum of 10^5 values may ask for as
    // many names with one base.
    int& suffix = next_suffix_.try_emplace(base, 2).first->second;
    while (names_.contains(name)) name = fmt::format("{}{}", base, suffix++);
    names_.insert(name);
    return name;
  }

  static std::optional<uint64_t> count(const Json& schema, const char* key,
                                       const std::string& path) {
    if (!schema.contains(key)) return std::nullopt;
    const Json& v = schema[key];
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
      error(path + "/" + key, fmt::format("'{}' must be a non-negative integer", key));
    }
    const auto n = v.get<uint64_t>();
    if (n > 10000) error(path + "/" + key, fmt::format("'{}' over 10000 is not supported", key));
    return n;
  }

  static std::string repeat(const std::string& x, uint64_t min, std::optional<uint64_t> max) {
    if (max) return fmt::format("( {} ){{{},{}}}", x, min, *max);
    return fmt::format("( {} ){{{},}}", x, min);
  }

  std::string visit(const Json& schema, const std::string& path) {
    if (depth_ >= kMaxNesting) {
      error(path, fmt::format("schemas nest deeper than {} levels (counting each $ref followed)",
                              kMaxNesting));
    }
    ++depth_;
    std::string body = visit_schema(schema, path);
    --depth_;
    return body;
  }

  std::string visit_schema(const Json& schema, const std::string& path) {
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) error(path, "schema 'false' matches nothing");
      return "value";
    }
    if (!schema.is_object()) error(path, "a schema must be an object or a boolean");
    for (const auto& [key, v] : schema.items()) {
      if (!kKeywords.contains(key) && !kAnnotations.contains(key)) {
        error(path + "/" + key, fmt::format("unsupported keyword '{}'", key));
      }
    }
    if (schema.contains("$ref")) {
      for (const auto& [key, v] : schema.items()) {
        if (key != "$ref" && kKeywords.contains(key)) {
          error(path + "/" + key, fmt::format("keyword '{}' next to '$ref' is not supported", key));
        }
      }
      return ref(schema["$ref"], path + "/$ref");
    }
    std::vector<std::string> alternatives;
    if (schema.contains("const")) {
      alternatives.push_back(literal(schema["const"]));
    } else if (schema.contains("enum")) {
      const Json& values = schema["enum"];
      if (!values.is_array() || values.empty())
        error(path + "/enum", "'enum' must be a non-empty array");
      alternatives.push_back(enum_trie(values, path));
    } else if (schema.contains("anyOf") || schema.contains("oneOf")) {
      const char* key = schema.contains("anyOf") ? "anyOf" : "oneOf";
      const Json& subs = schema[key];
      if (!subs.is_array() || subs.empty()) {
        error(path + "/" + key, fmt::format("'{}' must be a non-empty array", key));
      }
      for (const char* other : {"type", "properties", "items", "anyOf", "oneOf"}) {
        if (other != std::string(key) && schema.contains(other)) {
          error(path + "/" + other,
                fmt::format("keyword '{}' next to '{}' is not supported", other, key));
        }
      }
      // Branches that are only values (a union of Literals, as Pydantic writes it): one trie of
      // them all, as an enum.
      Json values = Json::array();
      for (const Json& sub : subs) {
        if (!only_values(sub)) {
          values.clear();
          break;
        }
        if (sub.contains("const")) {
          values.push_back(sub["const"]);
        } else {
          for (const Json& v : sub["enum"]) values.push_back(v);
        }
      }
      if (!values.empty()) {
        alternatives.push_back(enum_trie(values, path));
      } else {
        for (size_t i = 0; i < subs.size(); ++i) {
          alternatives.push_back(visit(subs[i], fmt::format("{}/{}/{}", path, key, i)));
        }
      }
    } else {
      std::vector<std::string> types;
      if (schema.contains("type")) {
        const Json& t = schema["type"];
        if (t.is_string()) {
          types.push_back(t.get<std::string>());
        } else if (t.is_array() && !t.empty()) {
          for (const Json& name : t) {
            if (!name.is_string()) error(path + "/type", "'type' names must be strings");
            types.push_back(name.get<std::string>());
          }
        } else {
          error(path + "/type", "'type' must be a string or a non-empty array of strings");
        }
      } else if (schema.contains("properties") || schema.contains("required") ||
                 schema.contains("additionalProperties")) {
        types.push_back("object");
      } else if (schema.contains("items") || schema.contains("minItems") ||
                 schema.contains("maxItems")) {
        types.push_back("array");
      } else if (schema.contains("minLength") || schema.contains("maxLength")) {
        types.push_back("string");
      }
      if (types.empty()) alternatives.push_back("value");
      for (const std::string& type : types) alternatives.push_back(typed(schema, type, path));
    }
    if (schema.contains("nullable") && schema["nullable"].is_boolean() &&
        schema["nullable"].get<bool>()) {
      alternatives.push_back("null");
    }
    if (alternatives.size() == 1) return alternatives[0];
    std::string body;
    for (const std::string& a : alternatives) body += (body.empty() ? "" : " | ") + a;
    return "( " + body + " )";
  }

  // A schema that is one const or a non-empty enum, with nothing else but annotations.
  static bool only_values(const Json& schema) {
    if (!schema.is_object() || schema.contains("const") == schema.contains("enum")) return false;
    if (schema.contains("enum") && (!schema["enum"].is_array() || schema["enum"].empty())) {
      return false;
    }
    for (const auto& [key, v] : schema.items()) {
      if (key != "const" && key != "enum" && !kAnnotations.contains(key)) return false;
    }
    return true;
  }

  // An enum as a trie of its values' JSON texts. As plain alternatives, values that share their
  // first characters would each keep a parse of the automaton alive (over kMaxStacks = 128
  // values, e.g. 200 country names, was "too ambiguous"); in the trie one parse follows each
  // branch. Every node where values branch (or one ends and others go on) is a rule of its own,
  // so long shared prefixes chain rules instead of nesting groups, and the trie is built and
  // printed in loops, never recursion.
  std::string enum_trie(const Json& values, const std::string& path) {
    struct Node {
      std::map<std::string, size_t> next;  // one UTF-8 character -> child
      bool ends = false;                   // a value ends here
    };
    std::vector<Node> trie(1);
    for (const Json& value : values) {
      const std::string text = value.dump();  // as literal() writes it
      size_t node = 0;
      for (size_t i = 0; i < text.size();) {
        const auto lead = static_cast<uint8_t>(text[i]);
        const size_t len = lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
        std::string ch = text.substr(i, len);
        i += len;
        auto it = trie[node].next.find(ch);
        if (it == trie[node].next.end()) {
          trie.emplace_back();
          it = trie[node].next.emplace(std::move(ch), trie.size() - 1).first;
        }
        node = it->second;
      }
      trie[node].ends = true;
    }
    const auto branches = [&](size_t n) {
      return trie[n].next.size() > 1 || (trie[n].ends && !trie[n].next.empty());
    };
    std::map<size_t, std::string> rule_of;  // branching node -> its rule
    std::vector<size_t> unprinted;
    const auto rule_name = [&](size_t n) {
      auto [it, added] = rule_of.try_emplace(n);
      if (added) {
        it->second = reserve_name(hint(path, "enum"));
        unprinted.push_back(n);
      }
      return it->second;
    };
    // The alternatives after node n: per edge, its characters up to the next branching node (then
    // that node's rule) or to the end of a value; "" where a value ends at n.
    const auto body = [&](size_t n) {
      std::string out;
      for (const auto& [first, child] : trie[n].next) {
        std::string text = first;
        size_t m = child;
        while (!branches(m) && !trie[m].next.empty()) {
          text += trie[m].next.begin()->first;
          m = trie[m].next.begin()->second;
        }
        out += (out.empty() ? "" : " | ") + ("\"" + escape_gbnf_literal(text) + "\"");
        if (branches(m)) out += " " + rule_name(m);
      }
      if (trie[n].ends) out += " | \"\"";
      return out;
    };
    const std::string root = body(0);
    while (!unprinted.empty()) {
      const size_t n = unprinted.back();
      unprinted.pop_back();
      rules_.push_back(rule_of[n] + " ::= " + body(n));
    }
    return trie[0].next.size() > 1 ? "( " + root + " )" : root;
  }

  std::string typed(const Json& schema, const std::string& type, const std::string& path) {
    if (type == "string") {
      const auto min = count(schema, "minLength", path);
      const auto max = count(schema, "maxLength", path);
      if (!min && !max) return "string";
      if (max && *max < min.value_or(0)) error(path, "'maxLength' below 'minLength'");
      return "\"\\\"\" " + repeat("char", min.value_or(0), max) + " \"\\\"\"";
    }
    if (type == "integer" || type == "number" || type == "boolean" || type == "null") return type;
    if (type == "array") return array(schema, path);
    if (type == "object") return object(schema, path);
    error(path + "/type", fmt::format("unknown type '{}'", type));
  }

  std::string array(const Json& schema, const std::string& path) {
    const auto min = count(schema, "minItems", path).value_or(0);
    const auto max = count(schema, "maxItems", path);
    if (max && *max < min) error(path, "'maxItems' below 'minItems'");
    const std::string item =
        schema.contains("items") ? visit(schema["items"], path + "/items") : "value";
    if (max && *max == 0) return R"("[" ws "]")";
    const std::string item_rule = new_rule(hint(path, "item"), item);
    const std::optional<uint64_t> rest_max = max ? std::optional<uint64_t>(*max - 1) : std::nullopt;
    std::string items = item_rule + " ws " +
                        repeat("\",\" ws " + item_rule + " ws", min > 0 ? min - 1 : 0, rest_max);
    if (min == 0) items = "( " + items + " )?";
    return new_rule(hint(path, "array"), "\"[\" ws " + items + " \"]\"");
  }

  std::string object(const Json& schema, const std::string& path) {
    const Json empty = Json::object();
    const Json& properties = schema.contains("properties") ? schema["properties"] : empty;
    if (!properties.is_object()) error(path + "/properties", "'properties' must be an object");
    std::set<std::string> required;
    if (schema.contains("required")) {
      const Json& r = schema["required"];
      if (!r.is_array()) error(path + "/required", "'required' must be an array of names");
      for (const Json& name : r) {
        if (!name.is_string()) error(path + "/required", "'required' must be an array of names");
        if (!properties.contains(name.get<std::string>())) {
          error(path + "/required", fmt::format("required property '{}' is not in 'properties'",
                                                name.get<std::string>()));
        }
        required.insert(name.get<std::string>());
      }
    }
    // Extra keys: additionalProperties, else any when there are no properties.
    std::optional<std::string> extra_value;
    if (schema.contains("additionalProperties")) {
      const Json& a = schema["additionalProperties"];
      if (!(a.is_boolean() && !a.get<bool>())) {
        extra_value = visit(a, path + "/additionalProperties");
      }
    } else if (!schema.contains("properties")) {
      extra_value = "value";
    }
    if (properties.empty() && extra_value == "value") return "object";
    std::optional<std::string> extra;
    if (extra_value) {
      extra = new_rule(hint(path, "extra"), "string ws \":\" ws " + *extra_value + " ws");
    }
    // first[k]: properties k.. with nothing written yet; next[k]: after something was written.
    std::vector<std::pair<std::string, const Json*>> props;
    for (const auto& [name, sub] : properties.items()) props.emplace_back(name, &sub);
    const size_t n = props.size();
    std::vector<std::string> first(n + 1);
    std::vector<std::string> next(n + 1);
    first[n] = extra ? "( " + *extra + " ( \",\" ws " + *extra + " )* )?" : "\"\"";
    next[n] = extra ? "( \",\" ws " + *extra + " )*" : "\"\"";
    for (size_t k = n; k-- > 0;) {
      const auto& [name, sub] = props[k];
      const std::string value = visit(*sub, path + "/properties/" + name);
      const std::string kv =
          new_rule(hint(path, name + "-kv"), literal(Json(name)) + " ws \":\" ws " + value + " ws");
      const bool is_required = required.contains(name);
      const std::string next_rule = reserve_name(hint(path, name + "-next"));
      rules_.push_back(next_rule + " ::= " +
                       (is_required ? "\",\" ws " + kv + " " + next[k + 1]
                                    : "( \",\" ws " + kv + " )? " + next[k + 1]));
      const std::string first_rule = reserve_name(hint(path, name + "-first"));
      rules_.push_back(first_rule + " ::= " + kv + " " + next[k + 1] +
                       (is_required ? "" : " | " + first[k + 1]));
      first[k] = first_rule;
      next[k] = next_rule;
    }
    return new_rule(hint(path, "object"), "\"{\" ws " + first[0] + " \"}\"");
  }

  static std::string hint(const std::string& path, const std::string& what) {
    const size_t slash = path.rfind('/');
    const std::string last = slash == std::string::npos ? path : path.substr(slash + 1);
    return last.empty() ? what : last + "-" + what;
  }

  std::string ref(const Json& target, const std::string& path) {
    if (!target.is_string()) error(path, "'$ref' must be a string");
    const std::string r = target.get<std::string>();
    auto it = refs_.find(r);
    if (it != refs_.end()) return it->second;
    if (r.empty() || r[0] != '#')
      error(path, fmt::format("only local '$ref's (\"#...\") are supported, not '{}'", r));
    const Json* resolved = nullptr;
    try {
      resolved = &root_.at(Json::json_pointer(r.substr(1)));
    } catch (const nlohmann::json::exception&) {
      error(path, fmt::format("'$ref' '{}' points to nothing", r));
    }
    const size_t slash = r.rfind('/');
    const std::string name =
        reserve_name(slash == std::string::npos ? "root" : r.substr(slash + 1));
    refs_.emplace(r, name);  // before the body: recursive references find it
    const std::string body = visit(*resolved, r.substr(1));
    rules_.push_back(name + " ::= " + body);
    return name;
  }

  Json root_;
  int depth_ = 0;  // visits in progress
  std::vector<std::string> rules_;
  std::set<std::string> names_;
  std::map<std::string, int> next_suffix_;  // reserve_name: the next number to try per base
  std::map<std::string, std::string> refs_;
};

}  // namespace

JsonParse parse_schema(std::string_view schema_json) {
  // Its copies and dumps recurse once per level of the document, too.
  constexpr size_t kMaxJsonDepth = 2 * SchemaCompiler::kMaxNesting;
  JsonParse parsed = parse_ordered_json(schema_json, kMaxJsonDepth);
  if (parsed.status == JsonParse::Status::kTooDeep) {
    fail("JSON schema: arrays and objects nest deeper than {} levels", kMaxJsonDepth);
  }
  if (!parsed.ok()) fail("JSON schema: not valid JSON: {}", parsed.error);
  return parsed;
}

std::string json_object_gbnf() { return std::string("root ::= object\n") + kPrimitives; }

std::string json_schema_to_gbnf(std::string_view schema_json) {
  JsonParse parsed = parse_schema(schema_json);
  Json schema = std::move(parsed.value);
  return SchemaCompiler(std::move(schema)).compile();
}

}  // namespace sieve::grammar
