// The policy grammar's pieces (policy_params.h): items, numbers, index lists, parameter ranges,
// and the JSON form's translation to policy strings.
#include <algorithm>
#include <cctype>
#include <charconv>

#include "sparsity/policy_params.h"

namespace sieve::sparsity {

// Index of the ')' matching the '(' at text[open]; throws if there is none.
size_t matching_paren(std::string_view text, size_t open, std::string_view policy) {
  int depth = 0;
  for (size_t i = open; i < text.size(); ++i) {
    if (text[i] == '(') ++depth;
    if (text[i] == ')' && --depth == 0) return i;
  }
  fail("{}: unbalanced '(' in \"{}\"", policy, text);
}

// Splits "a=1,b=(x,y),rest=p:c=2,d=3" into items; a `rest=` item without parentheses takes the
// rest of the text.
std::vector<Item> split_items(std::string_view text, std::string_view policy) {
  std::vector<Item> items;
  size_t begin = 0;
  while (begin <= text.size()) {
    if (begin == text.size()) fail("{}: empty parameter (trailing ',')", policy);
    const std::string_view remaining = text.substr(begin);
    if (remaining.starts_with("rest=") && !remaining.substr(5).starts_with("(")) {
      items.push_back({"rest", remaining.substr(5)});
      break;
    }
    size_t i = begin;
    while (i < text.size() && text[i] != ',') {
      if (text[i] == '(') {
        i = matching_paren(text, i, policy) + 1;
      } else if (text[i] == ')') {
        fail("{}: unbalanced ')' in \"{}\"", policy, text);
      } else {
        ++i;
      }
    }
    const std::string_view item = text.substr(begin, i - begin);
    if (item.empty()) fail("{}: empty parameter (two ',' in a row)", policy);
    const size_t at = item.find('@');
    const size_t eq = item.find('=');
    if (item.front() == '(' || (at != std::string_view::npos && at < eq)) {
      items.push_back({"", item});  // a group
    } else if (eq == std::string_view::npos || eq == 0) {
      fail("{}: expected KEY=VALUE, got \"{}\"", policy, item);
    } else {
      items.push_back({item.substr(0, eq), item.substr(eq + 1)});
    }
    if (i == text.size()) break;
    begin = i + 1;
  }
  return items;
}

std::string_view strip_parens(std::string_view text, std::string_view policy) {
  if (!text.starts_with("(")) return text;
  if (matching_paren(text, 0, policy) != text.size() - 1) {
    fail("{}: unexpected text after ')' in \"{}\"", policy, text);
  }
  return text.substr(1, text.size() - 2);
}

int64_t parse_int(std::string_view policy, std::string_view key, std::string_view value) {
  int64_t result = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), result);
  const bool digits_only = !value.empty() && std::all_of(value.begin(), value.end(), [](char c) {
    return c >= '0' && c <= '9';
  });
  if (!digits_only || ec != std::errc() || end != value.data() + value.size()) {
    fail("{}: {} must be a non-negative integer, got \"{}\"", policy, key, value);
  }
  return result;
}

double parse_double(std::string_view policy, std::string_view key, std::string_view value) {
  double result = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), result);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() ||
      !std::isfinite(result)) {
    fail("{}: {} must be a number, got \"{}\"", policy, key, value);
  }
  return result;
}

// "0+2-4+7" -> {0, 2, 3, 4, 7}.
IndexList parse_index_list(std::string_view policy, std::string_view key, std::string_view text) {
  IndexList list;
  size_t begin = 0;
  while (true) {
    const size_t plus = text.find('+', begin);
    const std::string_view part =
        text.substr(begin, plus == std::string_view::npos ? std::string_view::npos : plus - begin);
    const size_t dash = part.find('-');
    if (dash == std::string_view::npos) {
      list.indices.push_back(parse_int(policy, key, part));
    } else {
      const int64_t first = parse_int(policy, key, part.substr(0, dash));
      const int64_t last = parse_int(policy, key, part.substr(dash + 1));
      if (last < first) fail("{}: {} range \"{}\" runs backwards", policy, key, part);
      if (last - first > (1 << 20)) fail("{}: {} range \"{}\" is too long", policy, key, part);
      for (int64_t i = first; i <= last; ++i) list.indices.push_back(i);
    }
    if (plus == std::string_view::npos) break;
    begin = plus + 1;
  }
  std::sort(list.indices.begin(), list.indices.end());
  if (std::adjacent_find(list.indices.begin(), list.indices.end()) != list.indices.end()) {
    fail("{}: {} lists an index twice in \"{}\"", policy, key, text);
  }
  return list;
}

std::string index_list_string(const IndexList& list) {
  std::string out;
  const auto& v = list.indices;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (!out.empty()) out += '+';
    out += j > i ? fmt::format("{}-{}", v[i], v[j]) : fmt::format("{}", v[i]);
    i = j + 1;
  }
  return out;
}

GivenParams::GivenParams(std::string_view policy, std::span<const Item> items,
                         const std::vector<std::string_view>& allowed)
    : policy_(policy) {
  for (const Item& item : items) {
    if (item.key.empty()) fail("{}: unexpected group \"{}\"", policy, item.value);
    if (std::find(allowed.begin(), allowed.end(), item.key) == allowed.end()) {
      fail("{}: unknown parameter \"{}\" (expected {})", policy, item.key,
           fmt::join(allowed, ", "));
    }
    if (!values_.emplace(item.key, item.value).second) {
      fail("{}: parameter {} given twice", policy, item.key);
    }
  }
}

std::optional<std::string_view> GivenParams::get(std::string_view key) const {
  const auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string_view pooling_name(Pooling pooling) { return pooling == Pooling::kMax ? "max" : "avg"; }

std::string number_text(double value) { return fmt::format("{}", value); }

void check_range(std::string_view policy, std::string_view key, double value, const Range& range) {
  const bool bounded = std::isfinite(range.max);
  const bool ok = std::isfinite(value) && value >= range.min &&
                  (range.max_open ? value < range.max : value <= range.max) &&
                  (!range.odd || std::fmod(value, 2.0) == 1.0);
  if (ok) return;
  const std::string note = range.note.empty() ? "" : fmt::format(" {}", range.note);
  if (range.odd) fail("{}: {} must be odd and >= {}{}", policy, key, number_text(range.min), note);
  if (bounded) {
    fail("{}: {} must be in [{}, {}{}{}, got {}", policy, key, number_text(range.min),
         number_text(range.max), range.max_open ? ")" : "]", note, number_text(value));
  }
  fail("{}: {} must be >= {}{}, got {}", policy, key, number_text(range.min), note,
       number_text(value));
}

std::string policy_text(std::string_view name, const std::vector<std::string>& items) {
  if (items.empty()) return std::string(name);
  return fmt::format("{}:{}", name, fmt::join(items, ","));
}

namespace {

// A JSON scalar as policy-string text. Strings may hold only plain word characters, so that
// nothing can smuggle in separators.
std::string json_scalar_text(const Json& value, std::string_view where) {
  if (value.is_number_integer()) return value.dump();
  if (value.is_number_float()) return fmt::format("{}", value.get<double>());
  if (value.is_string()) {
    const std::string text = value.get<std::string>();
    const bool plain = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
    });
    if (!plain) fail("{} must be a plain word, got {}", where, value.dump());
    return text;
  }
  fail("{} must be a number or a string, got {}", where, value.dump());
}

std::string index_array_text(const Json& value, std::string_view where) {
  if (!value.is_array() || value.empty()) fail("{} must be a non-empty array of indices", where);
  std::string out;
  for (const Json& index : value) {
    if (!index.is_number_unsigned()) {
      fail("{} must hold non-negative integers, got {}", where, index.dump());
    }
    if (!out.empty()) out += '+';
    out += index.dump();
  }
  return out;
}

std::string json_object_to_policy_text(const Json& object, std::string_view where) {
  if (!object.contains("name") || !object["name"].is_string()) {
    fail("{}: a policy object needs a \"name\" string", where);
  }
  const std::string name = object["name"].get<std::string>();
  const std::string context = fmt::format("{} ({})", where, name);
  std::vector<std::string> items;
  std::optional<std::string> rest;
  for (const auto& [key, value] : object.items()) {
    if (key == "name") continue;
    const bool plain_key = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
    });
    if (!plain_key) fail("{}: bad parameter name {}", context, Json(key).dump());
    if (key == "rest") {
      rest = fmt::format("({})", json_to_policy_text(value, context + ".rest"));
    } else if (key == "groups") {
      if (!value.is_array()) fail("{}: groups must be an array", context);
      for (const Json& group : value) {
        if (!group.is_object() || !group.contains("policy")) {
          fail("{}: each group must be an object with \"policy\"", context);
        }
        std::string text =
            fmt::format("({})@", json_to_policy_text(group["policy"], context + ".policy"));
        if (group.contains("profile")) {
          text += "profile=" + json_scalar_text(group["profile"], context + ".profile");
        } else if (group.contains("kv")) {
          text += "kv=" + index_array_text(group["kv"], context + ".kv");
        } else if (group.contains("layers")) {
          text += index_array_text(group["layers"], context + ".layers");
        } else {
          fail("{}: a group needs \"profile\", \"kv\" or \"layers\"", context);
        }
        items.push_back(std::move(text));
      }
    } else {
      items.push_back(key + "=" + json_scalar_text(value, fmt::format("{}.{}", context, key)));
    }
  }
  if (rest) items.push_back("rest=" + *rest);
  if (items.empty()) return name;
  return fmt::format("{}:{}", name, fmt::join(items, ","));
}

}  // namespace

std::string json_to_policy_text(const Json& value, std::string_view where) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object()) return json_object_to_policy_text(value, where);
  fail("{}: a policy must be a string or an object, got {}", where, value.dump());
}

}  // namespace sieve::sparsity
