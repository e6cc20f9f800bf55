#include "server/chat_template.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sieve::server {
namespace {

// Nesting bounds checked while parsing, so that evaluation (recursive over the AST) stays within
// a small, fixed stack budget per macro call: (statements + expression depth) * max_call_depth
// frames at most.
constexpr int kMaxStatementNesting = 64;
constexpr int kMaxExpressionDepth = 128;
// Largest list range() may build; larger ones are certainly hostile.
constexpr int64_t kMaxRange = 1'000'000;

struct Pos {
  int line = 1;
  int column = 1;
};

[[noreturn]] void fail_at(Pos pos, const std::string& message) {
  fail("chat template {}:{}: {}", pos.line, pos.column, message);
}

// ---------------------------------------------------------------------------------------------
// Values: Python's data model as far as templates can observe it.

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

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_number() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  const std::string& s() const { return *str; }
};

// Insertion-ordered like a Python dict; string keys only (all that JSON and templates produce).
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

Value undefined(std::string what) {
  Value v;
  v.str = std::make_shared<const std::string>(std::move(what));
  return v;
}
Value none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value boolean(bool b) {
  Value v;
  v.kind = Kind::kBool;
  v.boolean = b;
  return v;
}
Value integer(int64_t i) {
  Value v;
  v.kind = Kind::kInt;
  v.integer = i;
  return v;
}
Value floating(double f) {
  Value v;
  v.kind = Kind::kFloat;
  v.number = f;
  return v;
}
Value string(std::string s) {
  Value v;
  v.kind = Kind::kString;
  v.str = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value list(List items) {
  Value v;
  v.kind = Kind::kList;
  v.list = std::make_shared<const List>(std::move(items));
  return v;
}
Value tuple(List items) {
  Value v = list(std::move(items));
  v.tuple = true;
  return v;
}
Value dict(Dict d) {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<const Dict>(std::move(d));
  return v;
}
Value callable(std::string name, std::function<Value(Interp&, CallArgs&, Pos)> call) {
  Value v;
  v.kind = Kind::kCallable;
  v.fn = std::make_shared<const Callable>(Callable{std::move(name), std::move(call)});
  return v;
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "function";
  }
  return "?";
}

[[noreturn]] void fail_undefined(const Value& v, Pos pos) {
  fail_at(pos, v.str ? *v.str : std::string("value is undefined"));
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.boolean;
    case Kind::kInt:
      return v.integer != 0;
    case Kind::kFloat:
      return v.number != 0;
    case Kind::kString:
      return !v.str->empty();
    case Kind::kList:
      return !v.list->empty();
    case Kind::kDict:
      return !v.dict->items.empty();
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

double as_double(const Value& v) {
  if (v.kind == Kind::kFloat) return v.number;
  if (v.kind == Kind::kBool) return v.boolean ? 1 : 0;
  return static_cast<double>(v.integer);
}
int64_t as_int(const Value& v) { return v.kind == Kind::kBool ? (v.boolean ? 1 : 0) : v.integer; }
bool is_integral(const Value& v) { return v.kind == Kind::kInt || v.kind == Kind::kBool; }

// Python's repr(float): shortest round-trip digits, always with a '.' or exponent.
std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", f);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string python_repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == quote || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

std::string to_str(const Value& v);

std::string repr(const Value& v) {
  return v.kind == Kind::kString ? python_repr_string(*v.str) : to_str(v);
}

// Python's str(); what {{ }} prints.
std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.boolean ? "True" : "False";
    case Kind::kInt:
      return std::to_string(v.integer);
    case Kind::kFloat:
      return float_repr(v.number);
    case Kind::kString:
      return *v.str;
    case Kind::kList: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i > 0) out += ", ";
        out += repr((*v.list)[i]);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      const Dict& d = v.kind == Kind::kDict ? *v.dict : *v.ns;
      std::string out = v.kind == Kind::kDict ? "{" : "<Namespace {";
      for (size_t i = 0; i < d.items.size(); ++i) {
        if (i > 0) out += ", ";
        out += python_repr_string(d.items[i].first) + ": " + repr(d.items[i].second);
      }
      return out + (v.kind == Kind::kDict ? "}" : "}>");
    }
    case Kind::kCallable:
      return "<function " + v.fn->name + ">";
  }
  return "";
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (is_integral(a) && is_integral(b)) return as_int(a) == as_int(b);
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return *a.str == *b.str;
    case Kind::kList: {
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i) {
        if (!equal((*a.list)[i], (*b.list)[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* other = b.dict->find(k);
        if (other == nullptr || !equal(v, *other)) return false;
      }
      return true;
    }
    case Kind::kNamespace:
      return a.ns == b.ns;
    case Kind::kCallable:
      return a.fn == b.fn;
    default:
      return false;
  }
}

// <0, 0, >0 like Python's ordering of numbers, strings and lists; other pairs are a TypeError.
int compare(const Value& a, const Value& b, Pos pos, const char* op) {
  if (a.is_number() && b.is_number()) {
    if (is_integral(a) && is_integral(b)) {
      return as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b) ? 1 : 0;
    }
    const double x = as_double(a), y = as_double(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind == Kind::kString && b.kind == Kind::kString) return a.str->compare(*b.str);
  if (a.kind == Kind::kList && b.kind == Kind::kList) {
    const List &x = *a.list, &y = *b.list;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equal(x[i], y[i])) return compare(x[i], y[i], pos, op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined()) fail_undefined(a, pos);
  if (b.is_undefined()) fail_undefined(b, pos);
  fail_at(pos, fmt::format("'{}' not supported between instances of '{}' and '{}'", op,
                           type_name(a), type_name(b)));
}

// Python's json.dumps(ensure_ascii=False), which is what transformers' tojson filter calls.
struct JsonStyle {
  std::optional<int> indent;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};

void dump_json_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void dump_json(const Value& v, const JsonStyle& style, int level, Pos pos, std::string& out) {
  auto newline = [&](int lvl) {
    if (style.indent) {
      out += '\n';
      out.append(static_cast<size_t>(*style.indent) * lvl, ' ');
    }
  };
  switch (v.kind) {
    case Kind::kNone:
      out += "null";
      return;
    case Kind::kBool:
      out += v.boolean ? "true" : "false";
      return;
    case Kind::kInt:
      out += std::to_string(v.integer);
      return;
    case Kind::kFloat:
      if (std::isnan(v.number)) {
        out += "NaN";
      } else if (std::isinf(v.number)) {
        out += v.number > 0 ? "Infinity" : "-Infinity";
      } else {
        out += float_repr(v.number);
      }
      return;
    case Kind::kString:
      dump_json_string(*v.str, out);
      return;
    case Kind::kList: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i > 0) out += style.item_separator;
        newline(level + 1);
        dump_json((*v.list)[i], style, level + 1, pos, out);
      }
      newline(level);
      out += ']';
      return;
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      const Dict& d = v.kind == Kind::kDict ? *v.dict : *v.ns;
      if (d.items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : d.items) items.push_back(&item);
      if (style.sort_keys) {
        std::sort(items.begin(), items.end(),
                  [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += style.item_separator;
        newline(level + 1);
        dump_json_string(items[i]->first, out);
        out += style.key_separator;
        dump_json(items[i]->second, style, level + 1, pos, out);
      }
      newline(level);
      out += '}';
      return;
    }
    case Kind::kUndefined:
      fail_undefined(v, pos);
    case Kind::kCallable:
      fail_at(pos, "Object of type function is not JSON serializable");
  }
}

Value from_json(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return none();
    case nlohmann::json::value_t::boolean:
      return boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return integer(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return floating(static_cast<double>(u));
      }
      return integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return floating(j.get<double>());
    case nlohmann::json::value_t::string:
      return string(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (const auto& [k, e] : j.items()) d.items.emplace_back(k, from_json(e));
      return dict(std::move(d));
    }
    default:
      return none();  // binary / discarded: not produced by JSON text
  }
}

// UTF-8 code point boundaries: Python indexes and measures strings by code point.
std::vector<size_t> code_point_starts(const std::string& s) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) starts.push_back(i);
  }
  return starts;
}

std::vector<std::string> code_points(const std::string& s) {
  const auto starts = code_point_starts(s);
  std::vector<std::string> out;
  out.reserve(starts.size());
  for (size_t i = 0; i < starts.size(); ++i) {
    const size_t end = i + 1 < starts.size() ? starts[i + 1] : s.size();
    out.push_back(s.substr(starts[i], end - starts[i]));
  }
  return out;
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string strip(const std::string& s, bool left, bool right,
                  const std::optional<std::string>& chars) {
  auto drop = [&](char c) { return chars ? chars->find(c) != std::string::npos : is_space(c); };
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end && drop(s[begin])) ++begin;
  }
  if (right) {
    while (end > begin && drop(s[end - 1])) --end;
  }
  return s.substr(begin, end - begin);
}

std::string ascii_upper(std::string s) {
  for (char& c : s) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return s;
}
std::string ascii_lower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Python's str.title(): upper-case a letter that follows a non-letter, lower-case the rest.
std::string python_title(const std::string& s) {
  std::string out = s;
  bool prev_letter = false;
  for (char& c : out) {
    if (is_alpha(c)) {
      c = prev_letter ? ascii_lower(std::string(1, c))[0] : ascii_upper(std::string(1, c))[0];
      prev_letter = true;
    } else {
      prev_letter = static_cast<unsigned char>(c) >= 0x80 && prev_letter;
    }
  }
  return out;
}

std::string capitalize(const std::string& s) {
  if (s.empty()) return s;
  return ascii_upper(s.substr(0, 1)) + ascii_lower(s.substr(1));
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` around every character.
    const auto cps = code_points(s);
    int64_t done = 0;
    for (const auto& cp : cps) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out += cp;
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t at = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(from, at);
    if (hit == std::string::npos) break;
    out.append(s, at, hit - at);
    out += to;
    at = hit + from.size();
    ++done;
  }
  out.append(s, at, std::string::npos);
  return out;
}

std::vector<std::string> split(const std::string& s, const std::optional<std::string>& sep,
                               int64_t max_split) {
  std::vector<std::string> out;
  if (!sep) {
    // Runs of whitespace separate; no empty pieces.
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && is_space(s[i])) ++i;
      if (i == s.size()) break;
      if (max_split >= 0 && static_cast<int64_t>(out.size()) == max_split) {
        out.push_back(strip(s.substr(i), false, true, std::nullopt));
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_space(s[j])) ++j;
      out.push_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  size_t at = 0;
  while (max_split < 0 || static_cast<int64_t>(out.size()) < max_split) {
    const size_t hit = s.find(*sep, at);
    if (hit == std::string::npos) break;
    out.push_back(s.substr(at, hit - at));
    at = hit + sep->size();
  }
  out.push_back(s.substr(at));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Lexer: source -> tokens. Whitespace control is applied to the text tokens afterwards, from the
// modifiers of the tags around each one.

enum class Tok {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kComment,  // a comment or raw/endraw tag: affects whitespace, then dropped
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type = Tok::kEof;
  std::string text;  // kText/kString: the (decoded) text; kName/kOp: the spelling
  int64_t integer = 0;
  double number = 0;
  Pos pos;
  // Tags: the '-' or '+' after the opening / before the closing delimiter (0 if none).
  char left_mod = 0;
  char right_mod = 0;
  size_t begin = 0, end = 0;  // kText: source range
};

bool is_name_start(char c) { return is_alpha(c) || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  // Like Jinja: line endings become '\n' and one trailing newline is dropped
  // (keep_trailing_newline=False).
  explicit Lexer(std::string_view source) {
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    size_t at = 0;
    while (at < src_.size()) {
      const size_t tag = find_tag(at);
      if (tag > at) push_text(at, tag);
      if (tag == src_.size()) break;
      at = lex_tag(tag);
    }
    apply_whitespace_control();
    std::vector<Token> out;
    for (auto& t : tokens_) {
      if (t.type == Tok::kComment) continue;
      if (t.type == Tok::kText) {
        t.text = src_.substr(t.begin, t.end - t.begin);
        if (t.text.empty()) continue;
      }
      out.push_back(std::move(t));
    }
    Token eof;
    eof.type = Tok::kEof;
    eof.pos = pos_of(src_.size());
    out.push_back(eof);
    return out;
  }

 private:
  Pos pos_of(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return Pos{static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  void push_text(size_t begin, size_t end) {
    Token t;
    t.type = Tok::kText;
    t.begin = begin;
    t.end = end;
    t.pos = pos_of(begin);
    tokens_.push_back(std::move(t));
  }

  char modifier_at(size_t i) const {
    return i < src_.size() && (src_[i] == '-' || src_[i] == '+') ? src_[i] : 0;
  }

  // Returns the offset after the tag.
  size_t lex_tag(size_t start) {
    const char kind = src_[start + 1];
    Token open;
    open.pos = pos_of(start);
    open.left_mod = modifier_at(start + 2);
    size_t at = start + 2 + (open.left_mod ? 1 : 0);
    if (kind == '#') {
      const size_t close = src_.find("#}", at);
      if (close == std::string::npos) fail_at(open.pos, "unterminated comment");
      open.type = Tok::kComment;
      if (close > at && (src_[close - 1] == '-' || src_[close - 1] == '+')) {
        open.right_mod = src_[close - 1];
      }
      tokens_.push_back(open);
      return close + 2;
    }
    const bool is_block = kind == '%';
    const char closer = is_block ? '%' : '}';
    open.type = is_block ? Tok::kBlockBegin : Tok::kVarBegin;
    const size_t first_token = tokens_.size();
    tokens_.push_back(open);
    std::string brackets;  // open ( [ { : an end delimiter inside them is not one
    while (true) {
      while (at < src_.size() && is_space(src_[at])) ++at;
      if (at >= src_.size()) fail_at(open.pos, is_block ? "unclosed '{%'" : "unclosed '{{'");
      if (brackets.empty()) {
        char mod = modifier_at(at);
        const size_t end_at = at + (mod ? 1 : 0);
        if (end_at + 1 < src_.size() && src_[end_at] == closer && src_[end_at + 1] == '}') {
          Token close;
          close.type = is_block ? Tok::kBlockEnd : Tok::kVarEnd;
          close.pos = pos_of(at);
          close.right_mod = mod;
          tokens_.push_back(close);
          at = end_at + 2;
          break;
        }
      }
      at = lex_expression_token(at, brackets);
    }
    // {% raw %}...{% endraw %}: the body is text, taken verbatim.
    if (is_block && tokens_.size() == first_token + 3 &&
        tokens_[first_token + 1].type == Tok::kName && tokens_[first_token + 1].text == "raw") {
      const char left = tokens_[first_token].left_mod, right = tokens_.back().right_mod;
      tokens_.resize(first_token);
      Token raw_open;
      raw_open.type = Tok::kComment;
      raw_open.pos = open.pos;
      raw_open.left_mod = left;
      raw_open.right_mod = right;
      tokens_.push_back(raw_open);
      return lex_raw_body(at, open.pos);
    }
    return at;
  }

  size_t lex_raw_body(size_t at, Pos open_pos) {
    for (size_t i = at; i + 1 < src_.size(); ++i) {
      if (src_[i] != '{' || src_[i + 1] != '%') continue;
      size_t j = i + 2;
      const char left = modifier_at(j);
      if (left) ++j;
      while (j < src_.size() && is_space(src_[j])) ++j;
      if (src_.compare(j, 6, "endraw") != 0) continue;
      j += 6;
      while (j < src_.size() && is_space(src_[j])) ++j;
      const char right = modifier_at(j);
      if (right) ++j;
      if (j + 1 >= src_.size() || src_[j] != '%' || src_[j + 1] != '}') continue;
      if (i > at) push_text(at, i);
      Token close;
      close.type = Tok::kComment;
      close.pos = pos_of(i);
      close.left_mod = left;
      close.right_mod = right;
      tokens_.push_back(close);
      return j + 2;
    }
    fail_at(open_pos, "'raw' block without 'endraw'");
  }

  size_t lex_expression_token(size_t at, std::string& brackets) {
    Token t;
    t.pos = pos_of(at);
    const char c = src_[at];
    if (is_name_start(c)) {
      size_t end = at;
      while (end < src_.size() && is_name_char(src_[end])) ++end;
      t.type = Tok::kName;
      t.text = src_.substr(at, end - at);
      tokens_.push_back(std::move(t));
      return end;
    }
    if (is_digit(c)) return lex_number(at, std::move(t));
    if (c == '\'' || c == '"') return lex_string(at, std::move(t));
    static constexpr std::string_view kTwoCharOps[] = {"==", "!=", "<=", ">=", "//", "**"};
    for (std::string_view op : kTwoCharOps) {
      if (src_.compare(at, 2, op) == 0) {
        t.type = Tok::kOp;
        t.text = std::string(op);
        tokens_.push_back(std::move(t));
        return at + 2;
      }
    }
    if (std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos) {
      fail_at(t.pos, fmt::format("unexpected character '{}'", c));
    }
    if (c == '(' || c == '[' || c == '{') brackets += c;
    if (c == ')' || c == ']' || c == '}') {
      const char opener = c == ')' ? '(' : c == ']' ? '[' : '{';
      if (brackets.empty() || brackets.back() != opener) {
        fail_at(t.pos, fmt::format("unexpected '{}'", c));
      }
      brackets.pop_back();
    }
    t.type = Tok::kOp;
    t.text = std::string(1, c);
    tokens_.push_back(std::move(t));
    return at + 1;
  }

  size_t lex_number(size_t at, Token t) {
    size_t end = at;
    auto digits = [&] {
      while (end < src_.size() && (is_digit(src_[end]) || src_[end] == '_')) ++end;
    };
    digits();
    bool is_float = false;
    if (end + 1 < src_.size() && src_[end] == '.' && is_digit(src_[end + 1])) {
      is_float = true;
      ++end;
      digits();
    }
    if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t exp = end + 1;
      if (exp < src_.size() && (src_[exp] == '+' || src_[exp] == '-')) ++exp;
      if (exp < src_.size() && is_digit(src_[exp])) {
        is_float = true;
        end = exp;
        digits();
      }
    }
    std::string text;
    for (size_t i = at; i < end; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    if (is_float) {
      t.type = Tok::kFloat;
      t.number = std::strtod(text.c_str(), nullptr);
    } else {
      t.type = Tok::kInt;
      errno = 0;
      const long long v = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) fail_at(t.pos, "integer literal out of range");
      t.integer = v;
    }
    tokens_.push_back(std::move(t));
    return end;
  }

  // Python's string-literal escapes (Jinja decodes literals with "unicode-escape").
  size_t lex_string(size_t at, Token t) {
    const char quote = src_[at];
    std::string value;
    size_t i = at + 1;
    auto hex = [&](size_t count) -> uint32_t {
      if (i + count > src_.size()) fail_at(t.pos, "truncated escape in string literal");
      uint32_t cp = 0;
      for (size_t k = 0; k < count; ++k) {
        const char h = src_[i + k];
        cp <<= 4;
        if (is_digit(h)) {
          cp |= static_cast<uint32_t>(h - '0');
        } else if (h >= 'a' && h <= 'f') {
          cp |= static_cast<uint32_t>(h - 'a' + 10);
        } else if (h >= 'A' && h <= 'F') {
          cp |= static_cast<uint32_t>(h - 'A' + 10);
        } else {
          fail_at(t.pos, "bad hex escape in string literal");
        }
      }
      i += count;
      return cp;
    };
    while (true) {
      if (i >= src_.size()) fail_at(t.pos, "unterminated string literal");
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) fail_at(t.pos, "unterminated string literal");
      const char e = src_[i + 1];
      i += 2;
      switch (e) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case '\\':
          value += '\\';
          break;
        case '\'':
          value += '\'';
          break;
        case '"':
          value += '"';
          break;
        case 'a':
          value += '\a';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'v':
          value += '\v';
          break;
        case '\n':
          break;  // line continuation
        case 'x':
          append_utf8(hex(2), value);
          break;
        case 'u':
          append_utf8(hex(4), value);
          break;
        case 'U': {
          const uint32_t cp = hex(8);
          if (cp > 0x10FFFF) fail_at(t.pos, "escape out of the Unicode range");
          append_utf8(cp, value);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) {
              cp = cp * 8 + static_cast<uint32_t>(src_[i++] - '0');
            }
            append_utf8(cp, value);
          } else {
            value += '\\';  // unknown escapes stay as written
            value += e;
          }
      }
    }
    t.type = Tok::kString;
    t.text = std::move(value);
    tokens_.push_back(std::move(t));
    return i + 1;
  }

  // trim_blocks: the first newline after a block or comment tag goes; lstrip_blocks: spaces and
  // tabs from the start of a line up to a block or comment tag go; '-' strips all whitespace on
  // its side, '+' disables the trim/lstrip on its side.
  void apply_whitespace_control() {
    for (size_t k = 0; k < tokens_.size(); ++k) {
      Token& t = tokens_[k];
      if (t.type != Tok::kText) continue;
      if (k > 0) {
        const Token& prev = tokens_[k - 1];
        const bool block_like = prev.type == Tok::kBlockEnd || prev.type == Tok::kComment;
        if (prev.right_mod == '-') {
          while (t.begin < t.end && is_space(src_[t.begin])) ++t.begin;
        } else if (block_like && prev.right_mod != '+' && t.begin < t.end &&
                   src_[t.begin] == '\n') {
          ++t.begin;
        }
      }
      if (k + 1 < tokens_.size()) {
        const Token& next = tokens_[k + 1];
        const bool block_like = next.type == Tok::kBlockBegin || next.type == Tok::kComment;
        if (next.left_mod == '-') {
          while (t.end > t.begin && is_space(src_[t.end - 1])) --t.end;
        } else if (block_like && next.left_mod != '+') {
          size_t run = t.end;
          while (run > t.begin && (src_[run - 1] == ' ' || src_[run - 1] == '\t')) --run;
          if (run == 0 || src_[run - 1] == '\n') t.end = run;
        }
      }
    }
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

// ---------------------------------------------------------------------------------------------
// AST. Expressions evaluate to a Value; statements append to the output.

struct Expr {
  Pos pos;
  int depth = 1;  // height of this subtree, bounded by kMaxExpressionDepth
  virtual ~Expr() = default;
  virtual Value eval(Interp& in) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

enum class Flow { kNormal, kBreak, kContinue };

struct Node {
  Pos pos;
  virtual ~Node() = default;
  virtual Flow render(Interp& in, std::string& out) const = 0;
};
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Literal : Expr {
  Value value;
  Value eval(Interp&) const override { return value; }
};

struct Name : Expr {
  std::string name;
  Value eval(Interp& in) const override;
};

struct ListLiteral : Expr {
  std::vector<ExprPtr> items;
  bool tuple = false;
  Value eval(Interp& in) const override;
};

struct DictLiteral : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value eval(Interp& in) const override;
};

struct Attr : Expr {  // obj.name
  ExprPtr object;
  std::string name;
  Value eval(Interp& in) const override;
};

struct Subscript : Expr {  // obj[index]
  ExprPtr object, index;
  Value eval(Interp& in) const override;
};

struct Slice : Expr {                 // obj[start:stop:step]
  ExprPtr object, start, stop, step;  // each may be null
  Value eval(Interp& in) const override;
};

struct Call : Expr {
  ExprPtr callee;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  Value eval(Interp& in) const override;
};

using FilterFn = Value (*)(Interp&, const Value&, CallArgs&, Pos);
using TestFn = bool (*)(Interp&, const Value&, CallArgs&, Pos);

struct Filter : Expr {  // operand | name(args)
  ExprPtr operand;
  std::string name;
  FilterFn fn = nullptr;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  Value eval(Interp& in) const override;
};

struct Test : Expr {  // operand is [not] name(args)
  ExprPtr operand;
  TestFn fn = nullptr;
  bool negated = false;
  std::vector<ExprPtr> args;
  Value eval(Interp& in) const override;
};

struct Unary : Expr {
  char op = '-';  // '-', '+', '!' (not)
  ExprPtr operand;
  Value eval(Interp& in) const override;
};

struct Binary : Expr {
  std::string op;  // + - * / // % ** ~ and or
  ExprPtr left, right;
  Value eval(Interp& in) const override;
};

struct Compare : Expr {  // a op1 b op2 c ...
  ExprPtr first;
  std::vector<std::pair<std::string, ExprPtr>> rest;  // ops: == != < <= > >= in notin
  Value eval(Interp& in) const override;
};

struct Conditional : Expr {       // then if cond else otherwise
  ExprPtr then, cond, otherwise;  // otherwise may be null (undefined)
  Value eval(Interp& in) const override;
};

struct TextNode : Node {
  std::string text;
  Flow render(Interp& in, std::string& out) const override;
};

struct OutputNode : Node {
  ExprPtr expr;
  Flow render(Interp& in, std::string& out) const override;
};

struct IfNode : Node {
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body otherwise;
  Flow render(Interp& in, std::string& out) const override;
};

struct ForNode : Node {
  std::vector<std::string> targets;
  ExprPtr iterable;
  ExprPtr filter;  // may be null
  Body body, otherwise;
  Flow render(Interp& in, std::string& out) const override;
};

struct SetNode : Node {
  std::vector<std::string> targets;  // one name, or several to unpack into
  std::string attribute;             // set targets[0].attribute = ... (namespace)
  ExprPtr value;                     // null for a block set
  Body body;                         // {% set x %}body{% endset %}
  Flow render(Interp& in, std::string& out) const override;
};

struct MacroNode : Node {
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null
  Body body;
  Flow render(Interp& in, std::string& out) const override;
};

struct FilterBlockNode : Node {    // {% filter name(args) %}body{% endfilter %}
  std::unique_ptr<Filter> filter;  // operand unset: the rendered body
  Body body;
  Flow render(Interp& in, std::string& out) const override;
};

struct LoopControlNode : Node {
  Flow flow = Flow::kBreak;
  Flow render(Interp&, std::string&) const override { return flow; }
};

struct BodyNode : Node {  // {% generation %}: transformers' assistant-mask marker, renders as is
  Body body;
  Flow render(Interp& in, std::string& out) const override;
};

FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);

// ---------------------------------------------------------------------------------------------
// Parser: recursive descent with Jinja's precedence, lowest first:
//   cond-expr (a if c else b) < or < and < not < compare (== != < <= > >= in, not in)
//   < + - < ~ < * / // % < ** < unary - + < postfix (.x [i] (args)) then | filter and is test

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse_template() {
    std::string end_tag;
    Body body = parse_body({}, end_tag);
    return body;
  }

 private:
  const Token& cur() const { return tokens_[at_]; }
  const Token& peek(size_t ahead = 1) const {
    return tokens_[std::min(at_ + ahead, tokens_.size() - 1)];
  }
  Token take() {
    Token t = tokens_[at_];
    if (at_ + 1 < tokens_.size()) ++at_;
    return t;
  }
  bool is_op(std::string_view op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(std::string_view name) const {
    return cur().type == Tok::kName && cur().text == name;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    take();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    take();
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::kEof:
        return "end of template";
      case Tok::kText:
        return "template text";
      case Tok::kVarBegin:
        return "'{{'";
      case Tok::kVarEnd:
        return "'}}'";
      case Tok::kBlockBegin:
        return "'{%'";
      case Tok::kBlockEnd:
        return "'%}'";
      case Tok::kString:
        return "string literal";
      case Tok::kInt:
      case Tok::kFloat:
        return "number";
      default:
        return "'" + t.text + "'";
    }
  }
  [[noreturn]] void unexpected(std::string_view expected) const {
    fail_at(cur().pos, fmt::format("expected {}, got {}", expected, describe(cur())));
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) unexpected(fmt::format("'{}'", op));
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) unexpected("a name");
    return take().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::kBlockEnd) unexpected("'%}'");
    take();
  }

  template <typename T>
  std::unique_ptr<T> make(Pos pos) {
    auto node = std::make_unique<T>();
    node->pos = pos;
    return node;
  }
  // Records the height of a new composite expression; deep trees would exhaust the stack.
  template <typename T>
  std::unique_ptr<T> sized(std::unique_ptr<T> node, std::initializer_list<const Expr*> children) {
    int depth = 0;
    for (const Expr* c : children) {
      if (c != nullptr) depth = std::max(depth, c->depth);
    }
    node->depth = depth + 1;
    if (node->depth > kMaxExpressionDepth) fail_at(node->pos, "expression nests too deeply");
    return node;
  }

  // ---- statements ----

  // Parses until a block tag named in `end_tags` (its name is consumed and stored in `end_tag`;
  // the rest of that tag is left to the caller), or the end of the template if `end_tags` is
  // empty.
  Body parse_body(std::initializer_list<std::string_view> end_tags, std::string& end_tag) {
    if (++nesting_ > kMaxStatementNesting) fail_at(cur().pos, "statements nest too deeply");
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kEof) {
        if (end_tags.size() == 0) break;
        fail_at(t.pos,
                fmt::format("unexpected end of template, expected '{}'", *(end_tags.end() - 1)));
      }
      if (t.type == Tok::kText) {
        auto node = make<TextNode>(t.pos);
        node->text = take().text;
        body.push_back(std::move(node));
      } else if (t.type == Tok::kVarBegin) {
        auto node = make<OutputNode>(take().pos);
        node->expr = parse_expression();
        if (cur().type != Tok::kVarEnd) unexpected("'}}'");
        take();
        body.push_back(std::move(node));
      } else if (t.type == Tok::kBlockBegin) {
        const Pos pos = take().pos;
        if (cur().type != Tok::kName) unexpected("a statement name");
        const std::string name = cur().text;
        if (std::find(end_tags.begin(), end_tags.end(), name) != end_tags.end()) {
          take();
          end_tag = name;
          --nesting_;
          return body;
        }
        body.push_back(parse_statement(pos));
      } else {
        unexpected("template text or a tag");
      }
    }
    --nesting_;
    return body;
  }

  NodePtr parse_statement(Pos pos) {
    const Token name_token = take();
    const std::string& name = name_token.text;
    if (name == "if") return parse_if(pos);
    if (name == "for") return parse_for(pos);
    if (name == "set") return parse_set(pos);
    if (name == "macro") return parse_macro(pos);
    if (name == "filter") return parse_filter_block(pos);
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail_at(name_token.pos, fmt::format("'{}' outside a loop", name));
      auto node = make<LoopControlNode>(pos);
      node->flow = name == "break" ? Flow::kBreak : Flow::kContinue;
      expect_block_end();
      return node;
    }
    if (name == "generation") {
      expect_block_end();
      auto node = make<BodyNode>(pos);
      std::string end_tag;
      node->body = parse_body({"endgeneration"}, end_tag);
      expect_block_end();
      return node;
    }
    fail_at(name_token.pos, fmt::format("unknown statement '{}'", name));
  }

  NodePtr parse_if(Pos pos) {
    auto node = make<IfNode>(pos);
    ExprPtr cond = parse_expression();
    while (true) {
      expect_block_end();
      std::string end_tag;
      Body body = parse_body({"elif", "else", "endif"}, end_tag);
      node->branches.emplace_back(std::move(cond), std::move(body));
      if (end_tag == "elif") {
        cond = parse_expression();
        continue;
      }
      if (end_tag == "else") {
        expect_block_end();
        node->otherwise = parse_body({"endif"}, end_tag);
      }
      expect_block_end();
      return node;
    }
  }

  NodePtr parse_for(Pos pos) {
    auto node = make<ForNode>(pos);
    const bool parenthesized = skip_op("(");
    do {
      node->targets.push_back(expect_name());
    } while (skip_op(","));
    if (parenthesized) expect_op(")");
    if (!skip_name("in")) unexpected("'in'");
    // No conditional expression here: a trailing `if` filters the items.
    node->iterable = parse_or();
    if (is_op(",")) {  // for x in a, b
      auto items = make<ListLiteral>(cur().pos);
      items->tuple = true;
      items->items.push_back(std::move(node->iterable));
      while (skip_op(",")) {
        if (is_name("if") || cur().type == Tok::kBlockEnd) break;
        items->items.push_back(parse_or());
      }
      node->iterable = std::move(items);
    }
    if (skip_name("if")) node->filter = parse_expression();
    if (is_name("recursive")) fail_at(cur().pos, "recursive loops are not supported");
    expect_block_end();
    ++loop_depth_;
    std::string end_tag;
    node->body = parse_body({"else", "endfor"}, end_tag);
    --loop_depth_;
    if (end_tag == "else") {
      expect_block_end();
      node->otherwise = parse_body({"endfor"}, end_tag);
    }
    expect_block_end();
    return node;
  }

  NodePtr parse_set(Pos pos) {
    auto node = make<SetNode>(pos);
    node->targets.push_back(expect_name());
    if (skip_op(".")) {
      node->attribute = expect_name();
    } else {
      while (skip_op(",")) node->targets.push_back(expect_name());
    }
    if (skip_op("=")) {
      node->value = parse_tuple();
      expect_block_end();
      return node;
    }
    if (node->targets.size() != 1 || !node->attribute.empty()) unexpected("'='");
    expect_block_end();
    std::string end_tag;
    node->body = parse_body({"endset"}, end_tag);
    expect_block_end();
    return node;
  }

  NodePtr parse_macro(Pos pos) {
    auto node = make<MacroNode>(pos);
    node->name = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      std::string param = expect_name();
      ExprPtr default_value;
      if (skip_op("=")) default_value = parse_expression();
      node->params.emplace_back(std::move(param), std::move(default_value));
      if (!skip_op(",")) break;
    }
    expect_op(")");
    expect_block_end();
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    std::string end_tag;
    node->body = parse_body({"endmacro"}, end_tag);
    loop_depth_ = saved_loop_depth;
    if (cur().type == Tok::kName) take();  // {% endmacro name %}
    expect_block_end();
    return node;
  }

  NodePtr parse_filter_block(Pos pos) {
    auto node = make<FilterBlockNode>(pos);
    node->filter = parse_filter_call(nullptr);
    expect_block_end();
    std::string end_tag;
    node->body = parse_body({"endfilter"}, end_tag);
    expect_block_end();
    return node;
  }

  // ---- expressions ----

  // `a, b` without brackets (in {% set %}) is a tuple.
  ExprPtr parse_tuple() {
    ExprPtr first = parse_expression();
    if (!is_op(",")) return first;
    auto items = make<ListLiteral>(first->pos);
    items->tuple = true;
    items->items.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Tok::kBlockEnd) break;
      items->items.push_back(parse_expression());
    }
    int depth = 0;
    for (const auto& e : items->items) depth = std::max(depth, e->depth);
    items->depth = depth + 1;
    return items;
  }

  ExprPtr parse_expression() {
    if (++expr_nesting_ > kMaxExpressionDepth) fail_at(cur().pos, "expression nests too deeply");
    ExprPtr e = parse_conditional();
    --expr_nesting_;
    return e;
  }

  ExprPtr parse_conditional() {
    ExprPtr then = parse_or();
    while (is_name("if")) {
      auto node = make<Conditional>(take().pos);
      node->cond = parse_or();
      if (skip_name("else")) node->otherwise = parse_conditional();
      node->then = std::move(then);
      const Expr *a = node->then.get(), *b = node->cond.get(), *c = node->otherwise.get();
      then = sized(std::move(node), {a, b, c});
    }
    return then;
  }

  ExprPtr binary(std::string op, ExprPtr left, ExprPtr right, Pos pos) {
    auto node = make<Binary>(pos);
    node->op = std::move(op);
    node->left = std::move(left);
    node->right = std::move(right);
    const Expr* l = node->left.get();
    const Expr* r = node->right.get();
    return sized(std::move(node), {l, r});
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const Pos pos = take().pos;
      left = binary("or", std::move(left), parse_and(), pos);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const Pos pos = take().pos;
      left = binary("and", std::move(left), parse_not(), pos);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      auto node = make<Unary>(take().pos);
      node->op = '!';
      if (++expr_nesting_ > kMaxExpressionDepth) fail_at(node->pos, "expression nests too deeply");
      node->operand = parse_not();
      --expr_nesting_;
      const Expr* operand = node->operand.get();
      return sized(std::move(node), {operand});
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    std::unique_ptr<Compare> node;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        take();
      } else if (is_name("in")) {
        op = "in";
        take();
      } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        op = "notin";
        take();
        take();
      } else {
        break;
      }
      if (!node) {
        node = make<Compare>(first->pos);
        node->first = std::move(first);
      }
      node->rest.emplace_back(std::move(op), parse_math1());
    }
    if (!node) return first;
    int depth = node->first->depth;
    for (const auto& [op, e] : node->rest) depth = std::max(depth, e->depth);
    node->depth = depth + 1;
    if (node->depth > kMaxExpressionDepth) fail_at(node->pos, "expression nests too deeply");
    return node;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token op = take();
      left = binary(op.text, std::move(left), parse_concat(), op.pos);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const Pos pos = take().pos;
      left = binary("~", std::move(left), parse_math2(), pos);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token op = take();
      left = binary(op.text, std::move(left), parse_pow(), op.pos);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Pos pos = take().pos;
      left = binary("**", std::move(left), parse_unary(true), pos);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      auto unary = make<Unary>(cur().pos);
      unary->op = take().text[0];
      if (++expr_nesting_ > kMaxExpressionDepth) fail_at(unary->pos, "expression nests too deeply");
      unary->operand = parse_unary(false);
      --expr_nesting_;
      const Expr* operand = unary->operand.get();
      node = sized(std::move(unary), {operand});
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filters_and_tests(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case Tok::kName: {
        const Token name = take();
        if (name.text == "true" || name.text == "True") return literal(boolean(true), name.pos);
        if (name.text == "false" || name.text == "False") return literal(boolean(false), name.pos);
        if (name.text == "none" || name.text == "None") return literal(none(), name.pos);
        auto node = make<Name>(name.pos);
        node->name = name.text;
        return node;
      }
      case Tok::kString: {
        const Pos pos = t.pos;
        std::string text = take().text;
        while (cur().type == Tok::kString) text += take().text;  // 'a' 'b' is 'ab'
        return literal(string(std::move(text)), pos);
      }
      case Tok::kInt:
        return literal(integer(t.integer), take().pos);
      case Tok::kFloat:
        return literal(floating(t.number), take().pos);
      case Tok::kOp:
        break;
      default:
        unexpected("an expression");
    }
    const Pos pos = t.pos;
    if (skip_op("(")) {
      if (skip_op(")")) return literal(tuple({}), pos);  // ()
      ExprPtr first = parse_expression();
      if (skip_op(")")) return first;
      auto items = make<ListLiteral>(pos);
      items->tuple = true;
      items->items.push_back(std::move(first));
      while (skip_op(",")) {
        if (is_op(")")) break;
        items->items.push_back(parse_expression());
      }
      expect_op(")");
      return finish_list(std::move(items));
    }
    if (skip_op("[")) {
      auto items = make<ListLiteral>(pos);
      while (!is_op("]")) {
        items->items.push_back(parse_expression());
        if (!skip_op(",")) break;
      }
      expect_op("]");
      return finish_list(std::move(items));
    }
    if (skip_op("{")) {
      auto node = make<DictLiteral>(pos);
      int depth = 0;
      while (!is_op("}")) {
        ExprPtr key = parse_expression();
        expect_op(":");
        ExprPtr value = parse_expression();
        depth = std::max({depth, key->depth, value->depth});
        node->items.emplace_back(std::move(key), std::move(value));
        if (!skip_op(",")) break;
      }
      expect_op("}");
      node->depth = depth + 1;
      if (node->depth > kMaxExpressionDepth) fail_at(pos, "expression nests too deeply");
      return node;
    }
    unexpected("an expression");
  }

  ExprPtr finish_list(std::unique_ptr<ListLiteral> items) {
    int depth = 0;
    for (const auto& e : items->items) depth = std::max(depth, e->depth);
    items->depth = depth + 1;
    if (items->depth > kMaxExpressionDepth) fail_at(items->pos, "expression nests too deeply");
    return items;
  }

  ExprPtr literal(Value v, Pos pos) {
    auto node = make<Literal>(pos);
    node->value = std::move(v);
    return node;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        const Pos pos = take().pos;
        auto attr = make<Attr>(pos);
        if (cur().type == Tok::kInt) {  // x.0 is x[0]
          auto sub = make<Subscript>(pos);
          sub->index = literal(integer(take().integer), pos);
          sub->object = std::move(node);
          const Expr* object = sub->object.get();
          node = sized(std::move(sub), {object});
          continue;
        }
        attr->name = expect_name();
        attr->object = std::move(node);
        const Expr* object = attr->object.get();
        node = sized(std::move(attr), {object});
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object) {
    const Pos pos = take().pos;  // '['
    ExprPtr start, stop, step;
    if (!is_op(":")) start = parse_expression();
    if (skip_op("]")) {
      auto sub = make<Subscript>(pos);
      sub->object = std::move(object);
      sub->index = std::move(start);
      const Expr *o = sub->object.get(), *i = sub->index.get();
      return sized(std::move(sub), {o, i});
    }
    expect_op(":");
    if (!is_op(":") && !is_op("]")) stop = parse_expression();
    if (skip_op(":")) {
      if (!is_op("]")) step = parse_expression();
    }
    expect_op("]");
    auto slice = make<Slice>(pos);
    slice->object = std::move(object);
    slice->start = std::move(start);
    slice->stop = std::move(stop);
    slice->step = std::move(step);
    const Expr *o = slice->object.get(), *a = slice->start.get(), *b = slice->stop.get(),
               *c = slice->step.get();
    return sized(std::move(slice), {o, a, b, c});
  }

  // Parses `(args)` after the current position; both call expressions and filters use it.
  int parse_arguments(std::vector<ExprPtr>& args,
                      std::vector<std::pair<std::string, ExprPtr>>& kwargs) {
    expect_op("(");
    int depth = 0;
    while (!is_op(")")) {
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        std::string key = take().text;
        take();
        kwargs.emplace_back(std::move(key), parse_expression());
        depth = std::max(depth, kwargs.back().second->depth);
      } else {
        if (!kwargs.empty()) fail_at(cur().pos, "positional argument follows keyword argument");
        args.push_back(parse_expression());
        depth = std::max(depth, args.back()->depth);
      }
      if (!skip_op(",")) break;
    }
    expect_op(")");
    return depth;
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto call = make<Call>(cur().pos);
    call->callee = std::move(callee);
    const int depth = parse_arguments(call->args, call->kwargs);
    call->depth = std::max(depth, call->callee->depth) + 1;
    if (call->depth > kMaxExpressionDepth) fail_at(call->pos, "expression nests too deeply");
    return call;
  }

  std::unique_ptr<Filter> parse_filter_call(ExprPtr operand) {
    auto filter = make<Filter>(cur().pos);
    filter->name = expect_name();
    filter->fn = find_filter(filter->name);
    if (filter->fn == nullptr)
      fail_at(filter->pos, fmt::format("unknown filter '{}'", filter->name));
    int depth = operand ? operand->depth : 0;
    if (is_op("(")) depth = std::max(depth, parse_arguments(filter->args, filter->kwargs));
    filter->operand = std::move(operand);
    filter->depth = depth + 1;
    if (filter->depth > kMaxExpressionDepth) fail_at(filter->pos, "expression nests too deeply");
    return filter;
  }

  ExprPtr parse_filters_and_tests(ExprPtr node) {
    while (true) {
      if (skip_op("|")) {
        node = parse_filter_call(std::move(node));
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_test(ExprPtr operand) {
    auto test = make<Test>(take().pos);  // 'is'
    test->negated = skip_name("not");
    const Token name = cur();
    std::string test_name = expect_name();
    test->fn = find_test(test_name);
    if (test->fn == nullptr) fail_at(name.pos, fmt::format("unknown test '{}'", test_name));
    int depth = operand->depth;
    if (is_op("(")) {
      std::vector<std::pair<std::string, ExprPtr>> kwargs;
      depth = std::max(depth, parse_arguments(test->args, kwargs));
      if (!kwargs.empty()) fail_at(test->pos, "tests take no keyword arguments");
    } else if ((cur().type == Tok::kName || cur().type == Tok::kString || cur().type == Tok::kInt ||
                cur().type == Tok::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      // `x is divisibleby 3`: one argument without parentheses
      if (is_name("is")) fail_at(cur().pos, "tests cannot be chained with 'is'");
      test->args.push_back(parse_postfix(parse_primary()));
      depth = std::max(depth, test->args.back()->depth);
    }
    test->operand = std::move(operand);
    test->depth = depth + 1;
    if (test->depth > kMaxExpressionDepth) fail_at(test->pos, "expression nests too deeply");
    return test;
  }

  std::vector<Token> tokens_;
  size_t at_ = 0;
  int nesting_ = 0;
  int expr_nesting_ = 0;
  int loop_depth_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Evaluation.

using Scope = std::unordered_map<std::string, Value>;

struct Interp {
  const ChatTemplateLimits& limits;
  // scopes[0]: the render context plus top-level {% set %}s. A for-loop iteration or a macro
  // call pushes one; a macro body sees only scopes[0] and its own (scope_base up).
  std::vector<Scope> scopes;
  size_t scope_base = 1;
  size_t steps = 0;
  size_t allocated = 0;
  int call_depth = 0;

  void step(Pos pos) {
    if (++steps > limits.max_steps) {
      fail_at(pos, fmt::format("rendering exceeds the limit of {} steps", limits.max_steps));
    }
  }
  // Called before building a string or list of `bytes`.
  void charge(size_t bytes, Pos pos) {
    if (bytes > limits.max_allocated_bytes || allocated + bytes > limits.max_allocated_bytes) {
      fail_at(pos, fmt::format("rendering exceeds the limit of {} bytes of values",
                               limits.max_allocated_bytes));
    }
    allocated += bytes;
  }
  Value make_string(std::string s, Pos pos) {
    charge(s.size(), pos);
    return string(std::move(s));
  }
  Value make_list(List items, Pos pos) {
    charge(items.size() * sizeof(Value), pos);
    return list(std::move(items));
  }
  void check_output(const std::string& out, Pos pos) const {
    if (out.size() > limits.max_output_bytes) {
      fail_at(pos, fmt::format("output exceeds the limit of {} bytes", limits.max_output_bytes));
    }
  }
  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value v) { scopes.back()[name] = std::move(v); }
};

const Scope& builtins();

Value Interp::lookup(const std::string& name) const {
  for (size_t i = scopes.size(); i-- > scope_base;) {
    const auto it = scopes[i].find(name);
    if (it != scopes[i].end()) return it->second;
  }
  if (const auto it = scopes[0].find(name); it != scopes[0].end()) return it->second;
  if (const auto it = builtins().find(name); it != builtins().end()) return it->second;
  return undefined(fmt::format("'{}' is undefined", name));
}

Flow render_body(const Body& body, Interp& in, std::string& out) {
  for (const auto& node : body) {
    in.step(node->pos);
    const Flow flow = node->render(in, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

const Value* arg(const CallArgs& args, size_t index, std::string_view name) {
  if (index < args.positional.size()) return &args.positional[index];
  for (const auto& [k, v] : args.named) {
    if (k == name) return &v;
  }
  return nullptr;
}

const std::string& expect_string(const Value& v, std::string_view what, Pos pos) {
  if (v.kind == Kind::kUndefined) fail_undefined(v, pos);
  if (v.kind != Kind::kString) {
    fail_at(pos, fmt::format("{} must be a string, not '{}'", what, type_name(v)));
  }
  return *v.str;
}

int64_t expect_int(const Value& v, std::string_view what, Pos pos) {
  if (v.kind == Kind::kUndefined) fail_undefined(v, pos);
  if (!is_integral(v)) {
    fail_at(pos, fmt::format("{} must be an integer, not '{}'", what, type_name(v)));
  }
  return as_int(v);
}

std::optional<std::string> optional_string(const CallArgs& args, size_t index,
                                           std::string_view name, Pos pos) {
  const Value* v = arg(args, index, name);
  if (v == nullptr || v->kind == Kind::kNone) return std::nullopt;
  return expect_string(*v, name, pos);
}

// What `for x in v` visits.
List iterate(const Value& v, Pos pos) {
  switch (v.kind) {
    case Kind::kList:
      return *v.list;
    case Kind::kDict: {
      List keys;
      for (const auto& [k, unused] : v.dict->items) keys.push_back(string(k));
      return keys;
    }
    case Kind::kString: {
      List chars;
      for (auto& cp : code_points(*v.str)) chars.push_back(string(std::move(cp)));
      return chars;
    }
    case Kind::kUndefined:
      return {};
    default:
      fail_at(pos, fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

Value call_method(Interp& in, const Value& self, const std::string& name, CallArgs& args, Pos pos);

bool is_string_method(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "strip",    "lstrip", "rstrip",  "upper", "lower", "title",      "capitalize", "startswith",
      "endswith", "split",  "replace", "find",  "join",  "splitlines", "count"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}
bool is_dict_method(std::string_view name) {
  return name == "items" || name == "keys" || name == "values" || name == "get";
}

Value bound_method(const Value& self, const std::string& name) {
  return callable(name, [self, name](Interp& in, CallArgs& args, Pos pos) {
    return call_method(in, self, name, args, pos);
  });
}

// obj.name: Jinja tries the Python attribute first (methods), then the item.
Value get_attr(const Value& obj, const std::string& name, Pos pos) {
  switch (obj.kind) {
    case Kind::kUndefined:
      fail_undefined(obj, pos);
    case Kind::kDict: {
      if (is_dict_method(name)) return bound_method(obj, name);
      if (const Value* v = obj.dict->find(name)) return *v;
      break;
    }
    case Kind::kNamespace:
      if (const Value* v = obj.ns->find(name)) return *v;
      break;
    case Kind::kString:
      if (is_string_method(name)) return bound_method(obj, name);
      break;
    default:
      break;
  }
  return undefined(fmt::format("'{}' object has no attribute '{}'", type_name(obj), name));
}

// obj[key]: the item first, then the attribute; a missing one is undefined, not an error.
Value get_item(const Value& obj, const Value& key, Pos pos) {
  if (obj.kind == Kind::kUndefined) fail_undefined(obj, pos);
  if (key.kind == Kind::kUndefined) return key;  // d[undefined] is just a missing item
  if ((obj.kind == Kind::kList || obj.kind == Kind::kString) && is_integral(key)) {
    int64_t index = as_int(key);
    if (obj.kind == Kind::kList) {
      const int64_t size = static_cast<int64_t>(obj.list->size());
      if (index < 0) index += size;
      if (index >= 0 && index < size) return (*obj.list)[static_cast<size_t>(index)];
    } else {
      const auto cps = code_points(*obj.str);
      const int64_t size = static_cast<int64_t>(cps.size());
      if (index < 0) index += size;
      if (index >= 0 && index < size) return string(cps[static_cast<size_t>(index)]);
    }
    return undefined(fmt::format("{} index {} out of range", type_name(obj), as_int(key)));
  }
  if (key.kind == Kind::kString) {
    if (obj.kind == Kind::kDict) {
      if (const Value* v = obj.dict->find(*key.str)) return *v;
    }
    return get_attr(obj, *key.str, pos);
  }
  return undefined(fmt::format("'{}' object has no item {}", type_name(obj), repr(key)));
}

// Python's slice index arithmetic.
std::vector<size_t> slice_indices(int64_t size, std::optional<int64_t> start,
                                  std::optional<int64_t> stop, int64_t step) {
  int64_t lo, hi;
  if (step > 0) {
    lo = start.value_or(0);
    hi = stop.value_or(size);
    if (lo < 0) lo = std::max<int64_t>(0, lo + size);
    if (hi < 0) hi = std::max<int64_t>(0, hi + size);
    lo = std::min(lo, size);
    hi = std::min(hi, size);
  } else {
    lo = start.value_or(size - 1);
    hi = stop.value_or(-1 - size);
    if (lo < 0) lo = std::max<int64_t>(-1, lo + size);
    if (hi < 0) hi = std::max<int64_t>(-1, hi + size);
    lo = std::min(lo, size - 1);
    hi = std::min(hi, size - 1);
  }
  std::vector<size_t> out;
  for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) out.push_back(static_cast<size_t>(i));
  return out;
}

bool contains(const Value& container, const Value& item, Pos pos) {
  switch (container.kind) {
    case Kind::kString:
      if (item.kind != Kind::kString) {
        fail_at(pos, fmt::format("'in <string>' requires string as left operand, not {}",
                                 type_name(item)));
      }
      return container.str->find(*item.str) != std::string::npos;
    case Kind::kList:
      return std::any_of(container.list->begin(), container.list->end(),
                         [&](const Value& v) { return equal(v, item); });
    case Kind::kDict:
      return item.kind == Kind::kString && container.dict->find(*item.str);
    case Kind::kNamespace:
      return item.kind == Kind::kString && container.ns->find(*item.str);
    case Kind::kUndefined:
      return false;
    default:
      fail_at(pos, fmt::format("argument of type '{}' is not iterable", type_name(container)));
  }
}

Value arithmetic(Interp& in, const std::string& op, const Value& l, const Value& r, Pos pos) {
  if (l.is_undefined()) fail_undefined(l, pos);
  if (r.is_undefined()) fail_undefined(r, pos);
  if (l.is_number() && r.is_number()) {
    const bool ints = is_integral(l) && is_integral(r);
    const int64_t a = as_int(l), b = as_int(r);
    const double x = as_double(l), y = as_double(r);
    int64_t result = 0;
    if (op == "+") {
      if (ints && !__builtin_add_overflow(a, b, &result)) return integer(result);
      return floating(x + y);
    }
    if (op == "-") {
      if (ints && !__builtin_sub_overflow(a, b, &result)) return integer(result);
      return floating(x - y);
    }
    if (op == "*") {
      if (ints && !__builtin_mul_overflow(a, b, &result)) return integer(result);
      return floating(x * y);
    }
    if (op == "/") {
      if (y == 0) fail_at(pos, "division by zero");
      return floating(x / y);
    }
    if (op == "//" || op == "%") {
      if (ints) {
        if (b == 0) fail_at(pos, "integer division or modulo by zero");
        if (a == std::numeric_limits<int64_t>::min() && b == -1) return floating(-x);
        int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) {  // Python floors
          --q;
          m += b;
        }
        return integer(op == "//" ? q : m);
      }
      if (y == 0) fail_at(pos, "float division or modulo by zero");
      const double q = std::floor(x / y);
      return floating(op == "//" ? q : x - q * y);
    }
    if (op == "**") {
      if (ints && b >= 0) {
        int64_t base = a, exponent = b, acc = 1;
        bool overflow = false;
        while (exponent > 0 && !overflow) {
          if (exponent & 1) overflow = __builtin_mul_overflow(acc, base, &acc);
          exponent >>= 1;
          if (exponent > 0 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
        }
        if (!overflow) return integer(acc);
      }
      return floating(std::pow(x, y));
    }
  }
  if (op == "+" && l.kind == Kind::kString && r.kind == Kind::kString) {
    in.charge(l.str->size() + r.str->size(), pos);
    return string(*l.str + *r.str);
  }
  if (op == "+" && l.kind == Kind::kList && r.kind == Kind::kList) {
    List items = *l.list;
    items.insert(items.end(), r.list->begin(), r.list->end());
    return in.make_list(std::move(items), pos);
  }
  if (op == "*" && (l.kind == Kind::kString || l.kind == Kind::kList) && is_integral(r)) {
    const int64_t times = std::max<int64_t>(0, as_int(r));
    const size_t unit = l.kind == Kind::kString ? l.str->size() : l.list->size() * sizeof(Value);
    if (unit == 0 || times == 0) return l.kind == Kind::kString ? string("") : list({});
    if (unit > 0 && static_cast<uint64_t>(times) > in.limits.max_allocated_bytes / unit) {
      in.charge(in.limits.max_allocated_bytes + 1, pos);  // fails with the limit's message
    }
    in.charge(unit * static_cast<size_t>(times), pos);
    if (l.kind == Kind::kString) {
      std::string s;
      for (int64_t k = 0; k < times; ++k) s += *l.str;
      return string(std::move(s));
    }
    List items;
    for (int64_t k = 0; k < times; ++k) items.insert(items.end(), l.list->begin(), l.list->end());
    return list(std::move(items));
  }
  if (op == "*" && is_integral(l) && (r.kind == Kind::kString || r.kind == Kind::kList)) {
    return arithmetic(in, op, r, l, pos);
  }
  fail_at(pos, fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(l),
                           type_name(r)));
}

Value Name::eval(Interp& in) const {
  in.step(pos);
  return in.lookup(name);
}

Value ListLiteral::eval(Interp& in) const {
  in.step(pos);
  List values;
  values.reserve(items.size());
  for (const auto& e : items) values.push_back(e->eval(in));
  Value v = in.make_list(std::move(values), pos);
  v.tuple = tuple;
  return v;
}

Value DictLiteral::eval(Interp& in) const {
  in.step(pos);
  Dict d;
  for (const auto& [k, v] : items) {
    const Value key = k->eval(in);
    d.set(expect_string(key, "dict key", k->pos), v->eval(in));
  }
  in.charge(d.items.size() * sizeof(Value), pos);
  return dict(std::move(d));
}

Value Attr::eval(Interp& in) const {
  in.step(pos);
  return get_attr(object->eval(in), name, pos);
}

Value Subscript::eval(Interp& in) const {
  in.step(pos);
  const Value obj = object->eval(in);
  return get_item(obj, index->eval(in), pos);
}

Value Slice::eval(Interp& in) const {
  in.step(pos);
  const Value obj = object->eval(in);
  auto bound = [&](const ExprPtr& e) -> std::optional<int64_t> {
    if (!e) return std::nullopt;
    const Value v = e->eval(in);
    if (v.kind == Kind::kNone) return std::nullopt;
    return expect_int(v, "slice index", e->pos);
  };
  const auto lo = bound(start), hi = bound(stop), by = bound(step);
  if (by && *by == 0) fail_at(pos, "slice step cannot be zero");
  if (obj.kind == Kind::kUndefined) fail_undefined(obj, pos);
  if (obj.kind == Kind::kList) {
    List items;
    for (size_t i : slice_indices(static_cast<int64_t>(obj.list->size()), lo, hi, by.value_or(1))) {
      items.push_back((*obj.list)[i]);
    }
    return in.make_list(std::move(items), pos);
  }
  if (obj.kind == Kind::kString) {
    const auto cps = code_points(*obj.str);
    std::string s;
    for (size_t i : slice_indices(static_cast<int64_t>(cps.size()), lo, hi, by.value_or(1))) {
      s += cps[i];
    }
    return in.make_string(std::move(s), pos);
  }
  return undefined(fmt::format("'{}' object is not subscriptable", type_name(obj)));
}

CallArgs evaluate_args(Interp& in, const std::vector<ExprPtr>& args,
                       const std::vector<std::pair<std::string, ExprPtr>>& kwargs) {
  CallArgs out;
  out.positional.reserve(args.size());
  for (const auto& e : args) out.positional.push_back(e->eval(in));
  for (const auto& [k, e] : kwargs) out.named.emplace_back(k, e->eval(in));
  return out;
}

Value Call::eval(Interp& in) const {
  in.step(pos);
  const Value fn = callee->eval(in);
  if (fn.kind == Kind::kUndefined) fail_undefined(fn, pos);
  if (fn.kind != Kind::kCallable) {
    fail_at(pos, fmt::format("'{}' object is not callable", type_name(fn)));
  }
  CallArgs call_args = evaluate_args(in, args, kwargs);
  return fn.fn->call(in, call_args, pos);
}

Value Filter::eval(Interp& in) const {
  in.step(pos);
  const Value value = operand->eval(in);
  CallArgs call_args = evaluate_args(in, args, kwargs);
  return fn(in, value, call_args, pos);
}

Value Test::eval(Interp& in) const {
  in.step(pos);
  const Value value = operand->eval(in);
  CallArgs call_args = evaluate_args(in, args, {});
  return boolean(fn(in, value, call_args, pos) != negated);
}

Value Unary::eval(Interp& in) const {
  in.step(pos);
  const Value v = operand->eval(in);
  if (op == '!') return boolean(!truthy(v));
  if (v.is_undefined()) fail_undefined(v, pos);
  if (!v.is_number()) {
    fail_at(pos, fmt::format("bad operand type for unary {}: '{}'", op, type_name(v)));
  }
  if (op == '+') return v.kind == Kind::kBool ? integer(as_int(v)) : v;
  if (v.kind == Kind::kFloat) return floating(-v.number);
  if (as_int(v) == std::numeric_limits<int64_t>::min()) return floating(-as_double(v));
  return integer(-as_int(v));
}

Value Binary::eval(Interp& in) const {
  in.step(pos);
  const Value l = left->eval(in);
  if (op == "and") return truthy(l) ? right->eval(in) : l;
  if (op == "or") return truthy(l) ? l : right->eval(in);
  const Value r = right->eval(in);
  if (op == "~") {
    std::string s = to_str(l) + to_str(r);
    return in.make_string(std::move(s), pos);
  }
  return arithmetic(in, op, l, r, pos);
}

Value Compare::eval(Interp& in) const {
  in.step(pos);
  Value l = first->eval(in);
  for (const auto& [op, expr] : rest) {
    Value r = expr->eval(in);
    bool ok;
    if (op == "==") {
      ok = equal(l, r);
    } else if (op == "!=") {
      ok = !equal(l, r);
    } else if (op == "in") {
      ok = contains(r, l, expr->pos);
    } else if (op == "notin") {
      ok = !contains(r, l, expr->pos);
    } else {
      const int c = compare(l, r, expr->pos, op.c_str());
      ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!ok) return boolean(false);
    l = std::move(r);
  }
  return boolean(true);
}

Value Conditional::eval(Interp& in) const {
  in.step(pos);
  if (truthy(cond->eval(in))) return then->eval(in);
  if (otherwise) return otherwise->eval(in);
  return undefined("the conditional expression had no else branch");
}

Flow TextNode::render(Interp& in, std::string& out) const {
  out += text;
  in.check_output(out, pos);
  return Flow::kNormal;
}

Flow OutputNode::render(Interp& in, std::string& out) const {
  const Value v = expr->eval(in);
  if (v.kind == Kind::kString) {
    out += *v.str;
  } else {
    out += to_str(v);
  }
  in.check_output(out, pos);
  return Flow::kNormal;
}

Flow IfNode::render(Interp& in, std::string& out) const {
  for (const auto& [cond, body] : branches) {
    if (truthy(cond->eval(in))) return render_body(body, in, out);
  }
  return render_body(otherwise, in, out);
}

void bind_targets(Interp& in, const std::vector<std::string>& targets, const Value& value,
                  Pos pos) {
  if (targets.size() == 1) {
    in.assign(targets[0], value);
    return;
  }
  if (value.kind != Kind::kList || value.list->size() != targets.size()) {
    fail_at(pos, fmt::format("cannot unpack {} into {} names", type_name(value), targets.size()));
  }
  for (size_t i = 0; i < targets.size(); ++i) in.assign(targets[i], (*value.list)[i]);
}

Flow ForNode::render(Interp& in, std::string& out) const {
  List items = iterate(iterable->eval(in), iterable->pos);
  in.charge(items.size() * sizeof(Value), pos);
  if (filter) {
    // `for x in xs if cond`: filtered first, so loop.index/length count the kept items only.
    List kept;
    in.scopes.emplace_back();
    for (auto& item : items) {
      in.step(pos);
      in.scopes.back().clear();
      bind_targets(in, targets, item, pos);
      if (truthy(filter->eval(in))) kept.push_back(std::move(item));
    }
    in.scopes.pop_back();
    items = std::move(kept);
  }
  if (items.empty()) return render_body(otherwise, in, out);
  const int64_t length = static_cast<int64_t>(items.size());
  auto index = std::make_shared<int64_t>(0);
  const Value cycle = callable("cycle", [index](Interp&, CallArgs& args, Pos p) {
    if (args.positional.empty()) fail_at(p, "no items for cycling given");
    return args.positional[static_cast<size_t>(*index) % args.positional.size()];
  });
  in.scopes.emplace_back();
  for (int64_t i = 0; i < length; ++i) {
    in.step(pos);
    *index = i;
    Scope& scope = in.scopes.back();
    scope.clear();
    Dict loop;
    loop.items = {{"index", integer(i + 1)},
                  {"index0", integer(i)},
                  {"revindex", integer(length - i)},
                  {"revindex0", integer(length - i - 1)},
                  {"first", boolean(i == 0)},
                  {"last", boolean(i == length - 1)},
                  {"length", integer(length)},
                  {"depth", integer(1)},
                  {"depth0", integer(0)},
                  {"cycle", cycle}};
    if (i > 0) loop.items.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
    if (i + 1 < length) loop.items.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
    scope["loop"] = dict(std::move(loop));
    bind_targets(in, targets, items[static_cast<size_t>(i)], pos);
    if (render_body(body, in, out) == Flow::kBreak) break;
  }
  in.scopes.pop_back();
  return Flow::kNormal;
}

Flow SetNode::render(Interp& in, std::string& out) const {
  Value v;
  if (value) {
    v = value->eval(in);
  } else {
    std::string captured;
    render_body(body, in, captured);
    v = in.make_string(std::move(captured), pos);
  }
  if (!attribute.empty()) {
    const Value target = in.lookup(targets[0]);
    if (target.kind != Kind::kNamespace) {
      fail_at(pos, fmt::format("cannot assign attribute '{}' on '{}', which is not a namespace",
                               attribute, targets[0]));
    }
    target.ns->set(attribute, std::move(v));
    return Flow::kNormal;
  }
  bind_targets(in, targets, v, pos);
  return Flow::kNormal;
}

Flow MacroNode::render(Interp& in, std::string&) const {
  const MacroNode* macro = this;  // the AST outlives every render
  in.assign(name, callable(name, [macro](Interp& interp, CallArgs& args, Pos pos) {
              if (args.positional.size() > macro->params.size()) {
                fail_at(pos, fmt::format("macro '{}' takes at most {} arguments", macro->name,
                                         macro->params.size()));
              }
              for (const auto& named : args.named) {
                const std::string& k = named.first;
                const bool known = std::any_of(macro->params.begin(), macro->params.end(),
                                               [&](const auto& param) { return param.first == k; });
                if (!known) {
                  fail_at(pos, fmt::format("macro '{}' has no parameter '{}'", macro->name, k));
                }
              }
              if (++interp.call_depth > interp.limits.max_call_depth) {
                fail_at(pos, fmt::format("macro calls nest deeper than {}",
                                         interp.limits.max_call_depth));
              }
              const size_t saved_base = interp.scope_base;
              interp.scopes.emplace_back();
              interp.scope_base = interp.scopes.size() - 1;
              for (size_t i = 0; i < macro->params.size(); ++i) {
                const auto& [param, default_value] = macro->params[i];
                const Value* given = arg(args, i, param);
                interp.assign(param, given ? *given
                                     : default_value
                                         ? default_value->eval(interp)
                                         : undefined(fmt::format("'{}' is undefined", param)));
              }
              std::string result;
              render_body(macro->body, interp, result);
              interp.scopes.pop_back();
              interp.scope_base = saved_base;
              --interp.call_depth;
              return string(std::move(result));
            }));
  return Flow::kNormal;
}

Flow FilterBlockNode::render(Interp& in, std::string& out) const {
  std::string captured;
  render_body(body, in, captured);
  CallArgs call_args = evaluate_args(in, filter->args, filter->kwargs);
  out += to_str(filter->fn(in, in.make_string(std::move(captured), pos), call_args, pos));
  in.check_output(out, pos);
  return Flow::kNormal;
}

Flow BodyNode::render(Interp& in, std::string& out) const { return render_body(body, in, out); }

// ---------------------------------------------------------------------------------------------
// Methods, filters, tests and global functions.

Value call_method(Interp& in, const Value& self, const std::string& name, CallArgs& args, Pos pos) {
  if (self.kind == Kind::kDict) {
    const Dict& d = *self.dict;
    if (name == "get") {
      const Value* key = arg(args, 0, "key");
      if (key == nullptr) fail_at(pos, "get() takes a key");
      if (key->kind == Kind::kString) {
        if (const Value* v = d.find(*key->str)) return *v;
      }
      const Value* fallback = arg(args, 1, "default");
      return fallback ? *fallback : none();
    }
    List out;
    for (const auto& [k, v] : d.items) {
      if (name == "keys") {
        out.push_back(string(k));
      } else if (name == "values") {
        out.push_back(v);
      } else {
        out.push_back(tuple({string(k), v}));
      }
    }
    return in.make_list(std::move(out), pos);
  }
  const std::string& s = *self.str;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return in.make_string(
        strip(s, name != "rstrip", name != "lstrip", optional_string(args, 0, "chars", pos)), pos);
  }
  if (name == "upper") return in.make_string(ascii_upper(s), pos);
  if (name == "lower") return in.make_string(ascii_lower(s), pos);
  if (name == "title") return in.make_string(python_title(s), pos);
  if (name == "capitalize") return in.make_string(capitalize(s), pos);
  if (name == "startswith" || name == "endswith") {
    const Value* affix = arg(args, 0, name == "startswith" ? "prefix" : "suffix");
    if (affix == nullptr) fail_at(pos, fmt::format("{}() takes an argument", name));
    const List options = affix->kind == Kind::kList ? *affix->list : List{*affix};
    for (const Value& option : options) {
      const std::string& a = expect_string(option, name + "() argument", pos);
      const bool hit = name == "startswith" ? s.compare(0, a.size(), a) == 0
                                            : s.size() >= a.size() &&
                                                  s.compare(s.size() - a.size(), a.size(), a) == 0;
      if (hit) return boolean(true);
    }
    return boolean(false);
  }
  if (name == "split") {
    const auto sep = optional_string(args, 0, "sep", pos);
    if (sep && sep->empty()) fail_at(pos, "empty separator");
    const Value* max_split = arg(args, 1, "maxsplit");
    List out;
    for (auto& piece : split(s, sep, max_split ? expect_int(*max_split, "maxsplit", pos) : -1)) {
      out.push_back(in.make_string(std::move(piece), pos));
    }
    return in.make_list(std::move(out), pos);
  }
  if (name == "splitlines") {
    List out;
    for (auto& piece : split(s, std::string("\n"), -1)) out.push_back(string(std::move(piece)));
    if (!out.empty() && out.back().str->empty()) out.pop_back();
    return in.make_list(std::move(out), pos);
  }
  if (name == "replace") {
    const Value* from = arg(args, 0, "old");
    const Value* to = arg(args, 1, "new");
    if (from == nullptr || to == nullptr) fail_at(pos, "replace() takes two arguments");
    const Value* count = arg(args, 2, "count");
    return in.make_string(replace_all(s, expect_string(*from, "replace() argument", pos),
                                      expect_string(*to, "replace() argument", pos),
                                      count ? expect_int(*count, "count", pos) : -1),
                          pos);
  }
  if (name == "find" || name == "count") {
    const Value* sub = arg(args, 0, "sub");
    if (sub == nullptr) fail_at(pos, fmt::format("{}() takes an argument", name));
    const std::string& needle = expect_string(*sub, name + "() argument", pos);
    if (name == "find") {
      const size_t at = s.find(needle);
      if (at == std::string::npos) return integer(-1);
      return integer(static_cast<int64_t>(code_point_starts(s.substr(0, at)).size()));
    }
    if (needle.empty()) return integer(static_cast<int64_t>(code_point_starts(s).size()) + 1);
    int64_t n = 0;
    for (size_t at = s.find(needle); at != std::string::npos;
         at = s.find(needle, at + needle.size())) {
      ++n;
    }
    return integer(n);
  }
  if (name == "join") {
    const Value* items = arg(args, 0, "iterable");
    if (items == nullptr) fail_at(pos, "join() takes an argument");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(*items, pos)) {
      if (!first) out += s;
      first = false;
      out += expect_string(item, "join() item", pos);
    }
    return in.make_string(std::move(out), pos);
  }
  fail_at(pos, fmt::format("'str' object has no method '{}'", name));
}

// The value at `path` ("a.b", "0") inside `item`, as map()/selectattr() address attributes.
Value attribute_path(const Value& item, const std::string& path, Pos pos) {
  Value v = item;
  for (const auto& part : split(path, std::string("."), -1)) {
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), is_digit);
    v = get_item(v, numeric ? integer(std::stoll(part)) : string(part), pos);
    if (v.is_undefined()) return v;
  }
  return v;
}

Value filter_trim(Interp& in, const Value& v, CallArgs& args, Pos pos) {
  return in.make_string(strip(to_str(v), true, true, optional_string(args, 0, "chars", pos)), pos);
}
Value filter_upper(Interp& in, const Value& v, CallArgs&, Pos pos) {
  return in.make_string(ascii_upper(to_str(v)), pos);
}
Value filter_lower(Interp& in, const Value& v, CallArgs&, Pos pos) {
  return in.make_string(ascii_lower(to_str(v)), pos);
}
Value filter_capitalize(Interp& in, const Value& v, CallArgs&, Pos pos) {
  return in.make_string(capitalize(to_str(v)), pos);
}
// Jinja's title: words start after whitespace, '-', or an opening bracket.
Value filter_title(Interp& in, const Value& v, CallArgs&, Pos pos) {
  std::string s = to_str(v);
  bool word_start = true;
  for (char& c : s) {
    const bool separator = is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (separator) {
      word_start = true;
      continue;
    }
    c = word_start ? ascii_upper(std::string(1, c))[0] : ascii_lower(std::string(1, c))[0];
    word_start = false;
  }
  return in.make_string(std::move(s), pos);
}
Value filter_string(Interp& in, const Value& v, CallArgs&, Pos pos) {
  return v.kind == Kind::kString ? v : in.make_string(to_str(v), pos);
}
Value filter_safe(Interp&, const Value& v, CallArgs&, Pos) { return v; }
Value filter_escape(Interp& in, const Value& v, CallArgs&, Pos pos) {
  std::string out;
  for (char c : to_str(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return in.make_string(std::move(out), pos);
}

Value filter_length(Interp&, const Value& v, CallArgs&, Pos pos) {
  switch (v.kind) {
    case Kind::kString:
      return integer(static_cast<int64_t>(code_point_starts(*v.str).size()));
    case Kind::kList:
      return integer(static_cast<int64_t>(v.list->size()));
    case Kind::kDict:
      return integer(static_cast<int64_t>(v.dict->items.size()));
    case Kind::kUndefined:
      return integer(0);
    default:
      fail_at(pos, fmt::format("object of type '{}' has no len()", type_name(v)));
  }
}

Value filter_first(Interp&, const Value& v, CallArgs&, Pos pos) {
  List items = iterate(v, pos);
  return items.empty() ? undefined("no first item, sequence was empty") : items.front();
}
Value filter_last(Interp&, const Value& v, CallArgs&, Pos pos) {
  List items = iterate(v, pos);
  return items.empty() ? undefined("no last item, sequence was empty") : items.back();
}

Value filter_default(Interp&, const Value& v, CallArgs& args, Pos) {
  const Value* fallback = arg(args, 0, "default_value");
  const Value* if_falsy = arg(args, 1, "boolean");
  const bool use_fallback = v.is_undefined() || (if_falsy && truthy(*if_falsy) && !truthy(v));
  if (!use_fallback) return v;
  return fallback ? *fallback : string("");
}

Value filter_join(Interp& in, const Value& v, CallArgs& args, Pos pos) {
  const auto separator = optional_string(args, 0, "d", pos).value_or("");
  const auto attribute = optional_string(args, 1, "attribute", pos);
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v, pos)) {
    if (!first) out += separator;
    first = false;
    out += to_str(attribute ? attribute_path(item, *attribute, pos) : item);
    if (out.size() > in.limits.max_allocated_bytes) in.charge(out.size(), pos);
  }
  return in.make_string(std::move(out), pos);
}

Value filter_replace(Interp& in, const Value& v, CallArgs& args, Pos pos) {
  const Value* from = arg(args, 0, "old");
  const Value* to = arg(args, 1, "new");
  if (from == nullptr || to == nullptr) fail_at(pos, "replace takes two arguments");
  const Value* count = arg(args, 2, "count");
  const std::string s = to_str(v);
  const std::string& a = expect_string(*from, "replace argument", pos);
  const std::string& b = expect_string(*to, "replace argument", pos);
  if (a.size() < b.size() && !a.empty()) {
    // The result can grow: bound it before building it.
    size_t hits = 0;
    for (size_t at = s.find(a); at != std::string::npos; at = s.find(a, at + a.size())) ++hits;
    in.charge(s.size() + hits * (b.size() - a.size()), pos);
  } else if (a.empty()) {
    in.charge(s.size() + (s.size() + 1) * b.size(), pos);
  }
  return in.make_string(replace_all(s, a, b, count ? expect_int(*count, "count", pos) : -1), pos);
}

Value filter_tojson(Interp& in, const Value& v, CallArgs& args, Pos pos) {
  JsonStyle style;
  if (const Value* indent = arg(args, 0, "indent"); indent && indent->kind != Kind::kNone) {
    style.indent = static_cast<int>(std::clamp<int64_t>(expect_int(*indent, "indent", pos), 0, 64));
    style.item_separator = ",";
  }
  if (const Value* seps = arg(args, 99, "separators"); seps && seps->kind != Kind::kNone) {
    if (seps->kind != Kind::kList || seps->list->size() != 2) {
      fail_at(pos, "separators must be a pair of strings");
    }
    style.item_separator = expect_string((*seps->list)[0], "separator", pos);
    style.key_separator = expect_string((*seps->list)[1], "separator", pos);
  }
  if (const Value* sort_keys = arg(args, 99, "sort_keys")) style.sort_keys = truthy(*sort_keys);
  std::string out;
  dump_json(v, style, 0, pos, out);
  return in.make_string(std::move(out), pos);
}

Value filter_int(Interp&, const Value& v, CallArgs& args, Pos pos) {
  const Value* fallback = arg(args, 0, "default");
  const Value def = fallback ? *fallback : integer(0);
  switch (v.kind) {
    case Kind::kBool:
    case Kind::kInt:
      return integer(as_int(v));
    case Kind::kFloat:
      if (!std::isfinite(v.number) || std::fabs(v.number) >= 9.2e18) return def;
      return integer(static_cast<int64_t>(v.number));
    case Kind::kString: {
      const std::string s = strip(*v.str, true, true, std::nullopt);
      if (s.empty()) return def;
      char* end = nullptr;
      errno = 0;
      const long long i = std::strtoll(s.c_str(), &end, 10);
      if (errno == 0 && end == s.c_str() + s.size()) return integer(i);
      const double d = std::strtod(s.c_str(), &end);
      if (end == s.c_str() + s.size() && std::isfinite(d) && std::fabs(d) < 9.2e18) {
        return integer(static_cast<int64_t>(d));
      }
      return def;
    }
    default:
      (void)pos;
      return def;
  }
}

Value filter_float(Interp&, const Value& v, CallArgs& args, Pos) {
  const Value* fallback = arg(args, 0, "default");
  const Value def = fallback ? *fallback : floating(0);
  if (v.is_number()) return floating(as_double(v));
  if (v.kind == Kind::kString) {
    const std::string s = strip(*v.str, true, true, std::nullopt);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return floating(d);
  }
  return def;
}

Value filter_list(Interp& in, const Value& v, CallArgs&, Pos pos) {
  return in.make_list(iterate(v, pos), pos);
}

Value filter_items(Interp& in, const Value& v, CallArgs&, Pos pos) {
  if (v.is_undefined()) return list({});
  if (v.kind != Kind::kDict) fail_at(pos, "items: can only get item pairs from a mapping");
  List out;
  for (const auto& [k, value] : v.dict->items) out.push_back(tuple({string(k), value}));
  return in.make_list(std::move(out), pos);
}

Value filter_reverse(Interp& in, const Value& v, CallArgs&, Pos pos) {
  if (v.kind == Kind::kString) {
    auto cps = code_points(*v.str);
    std::string out;
    for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
    return in.make_string(std::move(out), pos);
  }
  List items = iterate(v, pos);
  std::reverse(items.begin(), items.end());
  return in.make_list(std::move(items), pos);
}

Value filter_abs(Interp&, const Value& v, CallArgs&, Pos pos) {
  if (v.kind == Kind::kFloat) return floating(std::fabs(v.number));
  if (is_integral(v) && as_int(v) != std::numeric_limits<int64_t>::min()) {
    return integer(std::abs(as_int(v)));
  }
  fail_at(pos, fmt::format("bad operand type for abs(): '{}'", type_name(v)));
}

Value filter_indent(Interp& in, const Value& v, CallArgs& args, Pos pos) {
  std::string indentation = "    ";
  if (const Value* width = arg(args, 0, "width")) {
    indentation = width->kind == Kind::kString
                      ? *width->str
                      : std::string(static_cast<size_t>(std::clamp<int64_t>(
                                        expect_int(*width, "width", pos), 0, 256)),
                                    ' ');
  }
  const Value* first = arg(args, 1, "first");
  const Value* blank = arg(args, 2, "blank");
  std::vector<std::string> lines = split(to_str(v) + "\n", std::string("\n"), -1);
  lines.pop_back();  // splitlines() drops the piece after the final newline
  in.charge(lines.size() * indentation.size(), pos);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += '\n';
      if (!lines[i].empty() || (blank && truthy(*blank))) out += indentation;
    }
    out += lines[i];
  }
  if (first && truthy(*first)) out = indentation + out;
  return in.make_string(std::move(out), pos);
}

// select/reject/selectattr/rejectattr: keep the items whose (attribute) passes `test`, or is
// truthy when no test is named.
Value select_items(Interp& in, const Value& v, CallArgs& args, Pos pos, bool by_attribute,
                   bool keep_passing) {
  size_t next = 0;
  std::optional<std::string> attribute;
  if (by_attribute) {
    attribute = optional_string(args, next++, "attribute", pos);
    if (!attribute) fail_at(pos, "selectattr/rejectattr need an attribute name");
  }
  TestFn test = nullptr;
  if (const auto name = optional_string(args, next++, "test", pos)) {
    test = find_test(*name);
    if (test == nullptr) fail_at(pos, fmt::format("unknown test '{}'", *name));
  }
  CallArgs test_args;
  for (size_t i = next; i < args.positional.size(); ++i)
    test_args.positional.push_back(args.positional[i]);
  List out;
  for (const Value& item : iterate(v, pos)) {
    in.step(pos);
    const Value subject = attribute ? attribute_path(item, *attribute, pos) : item;
    const bool passes = test ? test(in, subject, test_args, pos) : truthy(subject);
    if (passes == keep_passing) out.push_back(item);
  }
  return in.make_list(std::move(out), pos);
}
Value filter_select(Interp& in, const Value& v, CallArgs& args, Pos pos) {
  return select_items(in, v, args, pos, false, true);
}
Value filter_reject(Interp& in, const Value& v, CallArgs& args, Pos pos) {
  return select_items(in, v, args, pos, false, false);
}
Value filter_selectattr(Interp& in, const Value& v, CallArgs& args, Pos pos) {
  return select_items(in, v, args, pos, true, true);
}
Value filter_rejectattr(Interp& in, const Value& v, CallArgs& args, Pos pos) {
  return select_items(in, v, args, pos, true, false);
}

// map(attribute='x', default=...) or map('filter', args...).
Value filter_map(Interp& in, const Value& v, CallArgs& args, Pos pos) {
  List out;
  if (const Value* attribute = arg(args, 99, "attribute")) {
    const std::string& path = expect_string(*attribute, "attribute", pos);
    const Value* fallback = arg(args, 99, "default");
    for (const Value& item : iterate(v, pos)) {
      in.step(pos);
      Value x = attribute_path(item, path, pos);
      out.push_back(x.is_undefined() && fallback ? *fallback : x);
    }
    return in.make_list(std::move(out), pos);
  }
  if (args.positional.empty()) fail_at(pos, "map needs a filter name or attribute=");
  const std::string& name = expect_string(args.positional[0], "filter name", pos);
  const FilterFn fn = find_filter(name);
  if (fn == nullptr) fail_at(pos, fmt::format("unknown filter '{}'", name));
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.named = args.named;
  for (const Value& item : iterate(v, pos)) {
    in.step(pos);
    out.push_back(fn(in, item, rest, pos));
  }
  return in.make_list(std::move(out), pos);
}

// The key sort/unique/min/max compare by: the attribute if named, lower-cased strings unless
// case_sensitive (Jinja's default is case-insensitive).
Value sort_key(const Value& item, const std::optional<std::string>& attribute, bool case_sensitive,
               Pos pos) {
  Value key = attribute ? attribute_path(item, *attribute, pos) : item;
  if (!case_sensitive && key.kind == Kind::kString) key = string(ascii_lower(*key.str));
  return key;
}

void sort_items(List& items, const std::optional<std::string>& attribute, bool case_sensitive,
                bool reverse, Pos pos) {
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& item : items) keyed.emplace_back(sort_key(item, attribute, case_sensitive, pos), item);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? compare(b.first, a.first, pos, "<") < 0
                   : compare(a.first, b.first, pos, "<") < 0;
  });
  for (size_t i = 0; i < items.size(); ++i) items[i] = std::move(keyed[i].second);
}

Value filter_sort(Interp& in, const Value& v, CallArgs& args, Pos pos) {
  const Value* reverse = arg(args, 0, "reverse");
  const Value* case_sensitive = arg(args, 1, "case_sensitive");
  List items = iterate(v, pos);
  sort_items(items, optional_string(args, 2, "attribute", pos),
             case_sensitive && truthy(*case_sensitive), reverse && truthy(*reverse), pos);
  return in.make_list(std::move(items), pos);
}

Value filter_dictsort(Interp& in, const Value& v, CallArgs& args, Pos pos) {
  if (v.kind != Kind::kDict) fail_at(pos, "dictsort: can only sort a mapping");
  const Value* case_sensitive = arg(args, 0, "case_sensitive");
  const auto by = optional_string(args, 1, "by", pos).value_or("key");
  const Value* reverse = arg(args, 2, "reverse");
  List items;
  for (const auto& [k, value] : v.dict->items) items.push_back(tuple({string(k), value}));
  sort_items(items, by == "value" ? "1" : "0", case_sensitive && truthy(*case_sensitive),
             reverse && truthy(*reverse), pos);
  return in.make_list(std::move(items), pos);
}

Value filter_unique(Interp& in, const Value& v, CallArgs& args, Pos pos) {
  const Value* case_sensitive = arg(args, 0, "case_sensitive");
  const auto attribute = optional_string(args, 1, "attribute", pos);
  List out, seen;
  for (const Value& item : iterate(v, pos)) {
    in.step(pos);
    Value key = sort_key(item, attribute, case_sensitive && truthy(*case_sensitive), pos);
    const bool dup =
        std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); });
    if (!dup) {
      seen.push_back(std::move(key));
      out.push_back(item);
    }
  }
  return in.make_list(std::move(out), pos);
}

Value extreme(Interp&, const Value& v, CallArgs& args, Pos pos, bool want_max) {
  const Value* case_sensitive = arg(args, 0, "case_sensitive");
  const auto attribute = optional_string(args, 1, "attribute", pos);
  const List items = iterate(v, pos);
  if (items.empty()) return undefined("no aggregated item, sequence was empty");
  const bool cs = case_sensitive && truthy(*case_sensitive);
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const int c = compare(sort_key(items[i], attribute, cs, pos),
                          sort_key(items[best], attribute, cs, pos), pos, want_max ? ">" : "<");
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}
Value filter_min(Interp& in, const Value& v, CallArgs& args, Pos pos) {
  return extreme(in, v, args, pos, false);
}
Value filter_max(Interp& in, const Value& v, CallArgs& args, Pos pos) {
  return extreme(in, v, args, pos, true);
}

Value filter_sum(Interp& in, const Value& v, CallArgs& args, Pos pos) {
  const auto attribute = optional_string(args, 0, "attribute", pos);
  const Value* start = arg(args, 1, "start");
  Value total = start ? *start : integer(0);
  for (const Value& item : iterate(v, pos)) {
    total =
        arithmetic(in, "+", total, attribute ? attribute_path(item, *attribute, pos) : item, pos);
  }
  return total;
}

FilterFn find_filter(std::string_view name) {
  static const std::unordered_map<std::string_view, FilterFn> kFilters = {
      {"trim", filter_trim},
      {"upper", filter_upper},
      {"lower", filter_lower},
      {"capitalize", filter_capitalize},
      {"title", filter_title},
      {"string", filter_string},
      {"safe", filter_safe},
      {"escape", filter_escape},
      {"e", filter_escape},
      {"length", filter_length},
      {"count", filter_length},
      {"first", filter_first},
      {"last", filter_last},
      {"default", filter_default},
      {"d", filter_default},
      {"join", filter_join},
      {"replace", filter_replace},
      {"tojson", filter_tojson},
      {"int", filter_int},
      {"float", filter_float},
      {"list", filter_list},
      {"items", filter_items},
      {"reverse", filter_reverse},
      {"abs", filter_abs},
      {"indent", filter_indent},
      {"select", filter_select},
      {"reject", filter_reject},
      {"selectattr", filter_selectattr},
      {"rejectattr", filter_rejectattr},
      {"map", filter_map},
      {"sort", filter_sort},
      {"dictsort", filter_dictsort},
      {"unique", filter_unique},
      {"min", filter_min},
      {"max", filter_max},
      {"sum", filter_sum},
  };
  const auto it = kFilters.find(name);
  return it == kFilters.end() ? nullptr : it->second;
}

bool test_defined(Interp&, const Value& v, CallArgs&, Pos) { return !v.is_undefined(); }
bool test_undefined(Interp&, const Value& v, CallArgs&, Pos) { return v.is_undefined(); }
bool test_none(Interp&, const Value& v, CallArgs&, Pos) { return v.kind == Kind::kNone; }
bool test_string(Interp&, const Value& v, CallArgs&, Pos) { return v.kind == Kind::kString; }
bool test_number(Interp&, const Value& v, CallArgs&, Pos) { return v.is_number(); }
bool test_integer(Interp&, const Value& v, CallArgs&, Pos) { return v.kind == Kind::kInt; }
bool test_float(Interp&, const Value& v, CallArgs&, Pos) { return v.kind == Kind::kFloat; }
bool test_boolean(Interp&, const Value& v, CallArgs&, Pos) { return v.kind == Kind::kBool; }
bool test_true(Interp&, const Value& v, CallArgs&, Pos) {
  return v.kind == Kind::kBool && v.boolean;
}
bool test_false(Interp&, const Value& v, CallArgs&, Pos) {
  return v.kind == Kind::kBool && !v.boolean;
}
bool test_mapping(Interp&, const Value& v, CallArgs&, Pos) { return v.kind == Kind::kDict; }
bool test_callable(Interp&, const Value& v, CallArgs&, Pos) { return v.kind == Kind::kCallable; }
// Python's iter()/len() work on strings, lists and dicts; Jinja's undefined iterates as empty.
bool test_iterable(Interp&, const Value& v, CallArgs&, Pos) {
  return v.kind == Kind::kString || v.kind == Kind::kList || v.kind == Kind::kDict ||
         v.kind == Kind::kUndefined;
}
bool test_odd(Interp&, const Value& v, CallArgs&, Pos pos) {
  return expect_int(v, "odd operand", pos) % 2 != 0;
}
bool test_even(Interp&, const Value& v, CallArgs&, Pos pos) {
  return expect_int(v, "even operand", pos) % 2 == 0;
}

const Value& test_arg(const CallArgs& args, std::string_view test, Pos pos) {
  if (args.positional.empty()) fail_at(pos, fmt::format("test '{}' needs an argument", test));
  return args.positional[0];
}

bool test_divisibleby(Interp&, const Value& v, CallArgs& args, Pos pos) {
  const int64_t d = expect_int(test_arg(args, "divisibleby", pos), "divisor", pos);
  if (d == 0) fail_at(pos, "divisibleby 0");
  return expect_int(v, "divisibleby operand", pos) % d == 0;
}
bool test_eq(Interp&, const Value& v, CallArgs& args, Pos pos) {
  return equal(v, test_arg(args, "eq", pos));
}
bool test_ne(Interp&, const Value& v, CallArgs& args, Pos pos) {
  return !equal(v, test_arg(args, "ne", pos));
}
bool test_lt(Interp&, const Value& v, CallArgs& args, Pos pos) {
  return compare(v, test_arg(args, "lt", pos), pos, "<") < 0;
}
bool test_le(Interp&, const Value& v, CallArgs& args, Pos pos) {
  return compare(v, test_arg(args, "le", pos), pos, "<=") <= 0;
}
bool test_gt(Interp&, const Value& v, CallArgs& args, Pos pos) {
  return compare(v, test_arg(args, "gt", pos), pos, ">") > 0;
}
bool test_ge(Interp&, const Value& v, CallArgs& args, Pos pos) {
  return compare(v, test_arg(args, "ge", pos), pos, ">=") >= 0;
}
bool test_in(Interp&, const Value& v, CallArgs& args, Pos pos) {
  return contains(test_arg(args, "in", pos), v, pos);
}
// Python's `is`: identity, which for None/True/False/small values is equality of value.
bool test_sameas(Interp&, const Value& v, CallArgs& args, Pos pos) {
  const Value& other = test_arg(args, "sameas", pos);
  if (v.kind != other.kind) return false;
  switch (v.kind) {
    case Kind::kNone:
    case Kind::kUndefined:
      return true;
    case Kind::kBool:
      return v.boolean == other.boolean;
    case Kind::kInt:
      return v.integer == other.integer;
    case Kind::kString:
      return v.str == other.str;
    case Kind::kList:
      return v.list == other.list;
    case Kind::kDict:
      return v.dict == other.dict;
    case Kind::kNamespace:
      return v.ns == other.ns;
    case Kind::kCallable:
      return v.fn == other.fn;
    default:
      return false;
  }
}
bool test_lower(Interp&, const Value& v, CallArgs&, Pos) {
  return v.kind == Kind::kString && ascii_lower(*v.str) == *v.str;
}
bool test_upper(Interp&, const Value& v, CallArgs&, Pos) {
  return v.kind == Kind::kString && ascii_upper(*v.str) == *v.str;
}

TestFn find_test(std::string_view name) {
  static const std::unordered_map<std::string_view, TestFn> kTests = {
      {"defined", test_defined},
      {"undefined", test_undefined},
      {"none", test_none},
      {"string", test_string},
      {"number", test_number},
      {"integer", test_integer},
      {"float", test_float},
      {"boolean", test_boolean},
      {"true", test_true},
      {"false", test_false},
      {"mapping", test_mapping},
      {"iterable", test_iterable},
      {"sequence", test_iterable},
      {"callable", test_callable},
      {"odd", test_odd},
      {"even", test_even},
      {"divisibleby", test_divisibleby},
      {"eq", test_eq},
      {"equalto", test_eq},
      {"==", test_eq},
      {"ne", test_ne},
      {"!=", test_ne},
      {"lt", test_lt},
      {"lessthan", test_lt},
      {"<", test_lt},
      {"le", test_le},
      {"<=", test_le},
      {"gt", test_gt},
      {"greaterthan", test_gt},
      {">", test_gt},
      {"ge", test_ge},
      {">=", test_ge},
      {"in", test_in},
      {"sameas", test_sameas},
      {"lower", test_lower},
      {"upper", test_upper},
  };
  const auto it = kTests.find(name);
  return it == kTests.end() ? nullptr : it->second;
}

const Scope& builtins() {
  static const Scope kBuiltins = [] {
    Scope s;
    s["raise_exception"] = callable("raise_exception", [](Interp&, CallArgs& args, Pos) -> Value {
      const Value* message = arg(args, 0, "message");
      throw ChatTemplateRaised(message ? to_str(*message) : std::string("raise_exception()"));
    });
    s["range"] = callable("range", [](Interp& in, CallArgs& args, Pos pos) {
      const size_t n = args.positional.size();
      if (n == 0 || n > 3) fail_at(pos, "range() takes 1 to 3 arguments");
      int64_t start = 0, stop = 0, step = 1;
      if (n == 1) {
        stop = expect_int(args.positional[0], "range() argument", pos);
      } else {
        start = expect_int(args.positional[0], "range() argument", pos);
        stop = expect_int(args.positional[1], "range() argument", pos);
        if (n == 3) step = expect_int(args.positional[2], "range() argument", pos);
      }
      if (step == 0) fail_at(pos, "range() step must not be zero");
      const double count =
          std::max(0.0, std::ceil((static_cast<double>(stop) - static_cast<double>(start)) /
                                  static_cast<double>(step)));
      if (count > static_cast<double>(kMaxRange)) {
        fail_at(pos, fmt::format("range() of {} items is over the limit of {}", count, kMaxRange));
      }
      List items;
      for (int64_t i = 0; i < static_cast<int64_t>(count); ++i)
        items.push_back(integer(start + i * step));
      return in.make_list(std::move(items), pos);
    });
    s["namespace"] = callable("namespace", [](Interp&, CallArgs& args, Pos pos) {
      Value v;
      v.kind = Kind::kNamespace;
      v.ns = std::make_shared<Dict>();
      for (const Value& initial : args.positional) {
        if (initial.kind != Kind::kDict) fail_at(pos, "namespace() takes a dict or keywords");
        for (const auto& [k, x] : initial.dict->items) v.ns->set(k, x);
      }
      for (const auto& [k, x] : args.named) v.ns->set(k, x);
      return v;
    });
    s["dict"] = callable("dict", [](Interp&, CallArgs& args, Pos pos) {
      Dict d;
      for (const Value& initial : args.positional) {
        if (initial.kind != Kind::kDict) fail_at(pos, "dict() takes a dict or keywords");
        for (const auto& [k, x] : initial.dict->items) d.set(k, x);
      }
      for (const auto& [k, x] : args.named) d.set(k, x);
      return dict(std::move(d));
    });
    // transformers passes datetime.now().strftime; templates use it for "Today Date".
    s["strftime_now"] = callable("strftime_now", [](Interp& in, CallArgs& args, Pos pos) {
      const Value* format = arg(args, 0, "format");
      if (format == nullptr) fail_at(pos, "strftime_now() takes a format");
      const std::string& f = expect_string(*format, "strftime_now() format", pos);
      if (f.size() > 256) fail_at(pos, "strftime_now() format is too long");
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      std::string buffer(1024, '\0');
      const size_t n = std::strftime(buffer.data(), buffer.size(), f.c_str(), &local);
      buffer.resize(n);
      return in.make_string(std::move(buffer), pos);
    });
    return s;
  }();
  return kBuiltins;
}

}  // namespace

struct ChatTemplate::Program {
  Body body;
};

ChatTemplate ChatTemplate::parse(std::string_view source) {
  Lexer lexer(source);
  Parser parser(lexer.run());
  auto program = std::make_shared<Program>();
  program->body = parser.parse_template();
  return ChatTemplate(std::move(program));
}

std::string ChatTemplate::render(const nlohmann::json& context,
                                 const ChatTemplateLimits& limits) const {
  if (!context.is_object()) fail("chat template context must be a JSON object");
  Interp in{limits, {}, 1, 0, 0, 0};
  in.scopes.emplace_back();
  for (const auto& [name, value] : context.items()) in.scopes[0][name] = from_json(value);
  std::string out;
  render_body(program_->body, in, out);
  return out;
}

std::string_view chatml_template() {
  return "{%- for message in messages %}"
         "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
         "{%- endfor %}"
         "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
}

}  // namespace sieve::server
