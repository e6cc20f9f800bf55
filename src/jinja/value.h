#pragma once
// The values templates compute with: Python's data model as far as a template can observe it
// (str() and repr(), == and <, truthiness, json.dumps), plus the string helpers that mirror
// Python's str methods. A render's context enters through from_json().
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/error.h"

namespace sieve::jinja {

// A position in the template source, for error messages.
struct Pos {
  int line = 1;
  int column = 1;
};

// Throws Error("chat template LINE:COLUMN: message").
[[noreturn]] void fail_at(Pos pos, const std::string& message);

struct Value;
struct Dict;
struct Callable;
struct Interp;
using List = std::vector<Value>;

enum class Kind {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kDict,
  kNamespace,
  kCallable
};

struct Value {
  Kind kind = Kind::kUndefined;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  // kString: the text; kUndefined: what was undefined, for the error when it is used.
  std::shared_ptr<const std::string> str;
  std::shared_ptr<const List> list;
  std::shared_ptr<const Dict> dict;
  std::shared_ptr<Dict> ns;  // namespace(): the one mutable kind
  std::shared_ptr<const Callable> fn;
  bool tuple = false;  // kList made as a Python tuple: prints as (a, b), never equals a list
  // Nesting of lists/dicts/bound methods inside this value (0 for scalars). Bounded by
  // kMaxValueDepth, so that printing, comparing and destroying a value recurse only so deep.
  int depth = 0;

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_number() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
};

// Values nest at most this deep; the context may nest kMaxContextDepth deep, which leaves room
// for the template to wrap context values (loop.previtem, [x], {'k': x}).
constexpr int kMaxValueDepth = 512;
constexpr int kMaxContextDepth = 128;

// Insertion-ordered like a Python dict; string keys only (all that JSON and templates produce).
// A namespace() is a Dict too, the one that can change; it may hold any value except a namespace,
// and no list or dict may hold one, so values form trees whose depth is known when they are made.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;

  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : items) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  void set(const std::string& key, Value value) {
    for (auto& [k, v] : items) {
      if (k == key) {
        v = std::move(value);
        return;
      }
    }
    items.emplace_back(key, std::move(value));
  }
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
};

struct Callable {
  std::string name;
  std::function<Value(Interp&, CallArgs&, Pos)> call;
};

Value undefined(std::string what);  // `what` is the error message if the value is used
Value none();
Value boolean(bool b);
Value integer(int64_t i);
Value floating(double f);
Value string(std::string s);
// These fail if an item is a namespace or the result would nest deeper than kMaxValueDepth.
Value list(List items);
Value tuple(List items);
Value dict(Dict d);
Value callable(std::string name, std::function<Value(Interp&, CallArgs&, Pos)> call);

const char* type_name(const Value& v);  // Python's type name, for messages
[[noreturn]] void fail_undefined(const Value& v, Pos pos);
bool truthy(const Value& v);
double as_double(const Value& v);
int64_t as_int(const Value& v);  // of kInt or kBool
bool is_integral(const Value& v);

std::string to_str(const Value& v);  // Python's str(): what {{ }} prints
std::string repr(const Value& v);    // Python's repr()
bool equal(const Value& a, const Value& b);
// <0, 0, >0 like Python's ordering of numbers, strings and lists; other pairs fail naming `op`.
int compare(const Value& a, const Value& b, Pos pos, const char* op);

// Python's json.dumps(ensure_ascii=False), which is what transformers' tojson filter calls.
struct JsonStyle {
  std::optional<int> indent;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
void dump_json(const Value& v, const JsonStyle& style, int level, Pos pos, std::string& out);

// Fails if `j` nests deeper than kMaxContextDepth. Dicts keep the key order of `j`.
Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);

// Strings are UTF-8; Python indexes and measures them by code point.
std::vector<size_t> code_point_starts(const std::string& s);
std::vector<std::string> code_points(const std::string& s);
bool is_space(char c);
bool is_alpha(char c);
bool is_digit(char c);
// Python's str.strip/lstrip/rstrip: whitespace, or any of `chars`.
std::string strip(const std::string& s, bool left, bool right,
                  const std::optional<std::string>& chars);
std::string ascii_upper(std::string s);
std::string ascii_lower(std::string s);
std::string python_title(const std::string& s);  // str.title()
std::string capitalize(const std::string& s);    // str.capitalize()
// str.replace; count < 0 replaces all.
std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count);
// str.split: on whitespace runs without `sep`; max_split < 0 means no limit.
std::vector<std::string> split(const std::string& s, const std::optional<std::string>& sep,
                               int64_t max_split);

}  // namespace sieve::jinja
