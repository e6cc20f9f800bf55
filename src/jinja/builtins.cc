#include "jinja/builtins.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <unordered_map>

namespace sieve::jinja {
namespace {

// Largest list range() may build; larger ones are certainly hostile.
constexpr int64_t kMaxRange = 1'000'000;

}  // namespace

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

namespace {

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
    style.item_separator = ',';  // a char: GCC 12 misreports -Wrestrict for "," here
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

}  // namespace

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

namespace {

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

}  // namespace

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
      throw Raised(message ? to_str(*message) : std::string("raise_exception()"));
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
      for (const auto& [k, x] : args.named) {
        if (x.kind == Kind::kNamespace) fail_at(pos, "a namespace cannot be put in a namespace");
        v.ns->set(k, x);
      }
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

}  // namespace sieve::jinja
