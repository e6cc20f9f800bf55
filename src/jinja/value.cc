#include "jinja/value.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace sieve::jinja {

void fail_at(Pos pos, const std::string& message) {
  fail("chat template {}:{}: {}", pos.line, pos.column, message);
}

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
namespace {

// 1 + the deepest item; fails on a namespace item or beyond kMaxValueDepth.
int container_depth(const Value& item, int depth) {
  if (item.kind == Kind::kNamespace)
    fail("chat template: a namespace cannot be put in a list or dict");
  depth = std::max(depth, item.depth + 1);
  if (depth > kMaxValueDepth) fail("chat template: values nest deeper than {}", kMaxValueDepth);
  return depth;
}

}  // namespace

Value list(List items) {
  Value v;
  v.kind = Kind::kList;
  v.depth = 1;
  for (const Value& item : items) v.depth = container_depth(item, v.depth);
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
  v.depth = 1;
  for (const auto& [k, item] : d.items) v.depth = container_depth(item, v.depth);
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

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

namespace {

template <typename Json>
Value from_json_at(const Json& j, int depth) {
  if (depth > kMaxContextDepth) {
    fail("chat template context nests deeper than {} levels", kMaxContextDepth);
  }
  switch (j.type()) {
    case Json::value_t::null:
      return none();
    case Json::value_t::boolean:
      return boolean(j.template get<bool>());
    case Json::value_t::number_integer:
      return integer(j.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return floating(static_cast<double>(u));
      }
      return integer(static_cast<int64_t>(u));
    }
    case Json::value_t::number_float:
      return floating(j.template get<double>());
    case Json::value_t::string:
      return string(j.template get<std::string>());
    case Json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_at(e, depth + 1));
      return list(std::move(items));
    }
    case Json::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (const auto& [k, e] : j.items()) d.items.emplace_back(k, from_json_at(e, depth + 1));
      return dict(std::move(d));
    }
    default:
      return none();  // binary / discarded: not produced by JSON text
  }
}

}  // namespace

Value from_json(const nlohmann::json& j) { return from_json_at(j, 0); }
Value from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

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
bool is_digit(char c) { return c >= '0' && c <= '9'; }

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

}  // namespace sieve::jinja
