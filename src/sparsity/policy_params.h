#pragma once
// Internal to src/sparsity: the policy grammar's pieces (policy_spec.h has the grammar) and the
// parameter tables every policy declares beside its code. From a table, generic code reads,
// checks, prints and writes as JSON a policy's KEY=VALUE parameters:
//
//   const Param<H2OSpec> kParams[] = {
//       {"B", &H2OSpec::heavy_budget, "heavy hitters kept besides the window", AtLeast(1),
//        Presence::kRequired},
//       {"W", &H2OSpec::window, "the most recent W tokens are never evicted"},
//   };
//
// A parameter's default is its field's value in a default-constructed spec, so the struct in
// policy_spec.h stays the one place that says it. Printing and JSON follow the table's order.
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "sparsity/policy_spec.h"
#include "util/error.h"

namespace sieve::sparsity {

using Json = nlohmann::json;

// ------------------------------------------------------------------------------ the grammar

// One item of a policy's parameter list, split at top-level commas.
struct Item {
  std::string_view key;    // empty for a group item
  std::string_view value;  // after '=' (or the whole group item)
};

// Index of the ')' matching the '(' at text[open]; throws if there is none.
size_t matching_paren(std::string_view text, size_t open, std::string_view policy);
// Splits "a=1,b=(x,y),rest=p:c=2,d=3" into items; a `rest=` item without parentheses takes the
// rest of the text.
std::vector<Item> split_items(std::string_view text, std::string_view policy);
// "(x)" -> "x"; anything else unchanged.
std::string_view strip_parens(std::string_view text, std::string_view policy);
int64_t parse_int(std::string_view policy, std::string_view key, std::string_view value);
double parse_double(std::string_view policy, std::string_view key, std::string_view value);
// "0+2-4+7" -> {0, 2, 3, 4, 7}; and back, runs joined by '-'.
IndexList parse_index_list(std::string_view policy, std::string_view key, std::string_view text);
std::string index_list_string(const IndexList& list);
// One policy string (no spaces), not yet validated.
PolicySpec parse_node(std::string_view text);

// JSON (policy_spec.h's form) -> the equivalent policy string, parsed by the one parser.
std::string json_to_policy_text(const Json& value, std::string_view where);

// The KEY=VALUE items of one policy, each taken once; keys outside `allowed` are refused.
class GivenParams {
 public:
  GivenParams(std::string_view policy, std::span<const Item> items,
              const std::vector<std::string_view>& allowed);
  std::string_view policy() const { return policy_; }
  std::optional<std::string_view> get(std::string_view key) const;

 private:
  std::string_view policy_;
  std::map<std::string_view, std::string_view> values_;
};

// ------------------------------------------------------------------------------ parameters

// The allowed values of a number parameter (integers are checked as numbers).
struct Range {
  double min = 0.0;  // integers: counts are never negative
  double max = std::numeric_limits<double>::infinity();
  bool max_open = false;  // [min, max) rather than [min, max]
  bool odd = false;       // integers: odd (pooling kernels are centered)
  std::string_view note;  // appended to the error, e.g. "(1 = uniform budgets)"
};
inline Range AtLeast(double min, std::string_view note = {}) { return {.min = min, .note = note}; }
inline Range Fraction() { return {.min = 0.0, .max = 1.0}; }

enum class Presence : uint8_t {
  kDefaulted,      // optional, printed always
  kRequired,       // must be given (the field's default is a placeholder)
  kUnlessDefault,  // optional, printed only when it differs from the default
};

template <typename Spec>
struct Param {
  std::string_view key;
  std::variant<int64_t Spec::*, double Spec::*, Pooling Spec::*> field;
  std::string_view doc;  // what it means; a missing required parameter's error quotes it
  Range range = {};
  Presence presence = Presence::kDefaulted;
};

std::string_view pooling_name(Pooling pooling);
// A number as policy strings and JSON print it (shortest round-tripping form).
std::string number_text(double value);
void check_range(std::string_view policy, std::string_view key, double value, const Range& range);

template <typename Spec>
std::vector<std::string_view> param_keys(std::span<const Param<Spec>> params,
                                         std::span<const std::string_view> except = {}) {
  std::vector<std::string_view> keys;
  for (const Param<Spec>& p : params) {
    if (std::find(except.begin(), except.end(), p.key) == except.end()) keys.push_back(p.key);
  }
  return keys;
}

// Sets the parameters `given` names (the others keep spec's values). Required ones must be given.
template <typename Spec>
void read_params(std::span<const Param<Spec>> params, const GivenParams& given, Spec& spec,
                 std::span<const std::string_view> except = {}) {
  for (const Param<Spec>& p : params) {
    if (std::find(except.begin(), except.end(), p.key) != except.end()) continue;
    const std::optional<std::string_view> text = given.get(p.key);
    if (!text) {
      if (p.presence == Presence::kRequired)
        fail("{}: missing {} ({})", given.policy(), p.key, p.doc);
      continue;
    }
    std::visit(
        [&](auto member) {
          using T = std::remove_reference_t<decltype(spec.*member)>;
          if constexpr (std::is_same_v<T, int64_t>) {
            spec.*member = parse_int(given.policy(), p.key, *text);
          } else if constexpr (std::is_same_v<T, double>) {
            spec.*member = parse_double(given.policy(), p.key, *text);
          } else if (*text == "max" || *text == "avg") {
            spec.*member = *text == "max" ? Pooling::kMax : Pooling::kAvg;
          } else {
            fail("{}: {} must be max or avg, got \"{}\"", given.policy(), p.key, *text);
          }
        },
        p.field);
  }
}

template <typename Spec>
void check_params(std::span<const Param<Spec>> params, const Spec& spec, std::string_view policy) {
  for (const Param<Spec>& p : params) {
    std::visit(
        [&](auto member) {
          if constexpr (!std::is_same_v<std::remove_cvref_t<decltype(spec.*member)>, Pooling>) {
            check_range(policy, p.key, static_cast<double>(spec.*member), p.range);
          }
        },
        p.field);
  }
}

// Calls emit(key, value) for each parameter to print, in table order; value is an int64_t,
// a double or a Pooling.
template <typename Spec, typename Emit>
void for_each_shown(std::span<const Param<Spec>> params, const Spec& spec, Emit&& emit,
                    std::span<const std::string_view> except = {}) {
  if constexpr (!std::is_empty_v<Spec>) {  // full has no parameters
    static const Spec defaults{};
    for (const Param<Spec>& p : params) {
      if (std::find(except.begin(), except.end(), p.key) != except.end()) continue;
      std::visit(
          [&](auto member) {
            if (p.presence == Presence::kUnlessDefault && spec.*member == defaults.*member) return;
            emit(p.key, spec.*member);
          },
          p.field);
    }
  }
}

template <typename Spec>
void print_params(std::span<const Param<Spec>> params, const Spec& spec,
                  std::vector<std::string>& items, std::span<const std::string_view> except = {}) {
  for_each_shown(
      params, spec,
      [&](std::string_view key, auto value) {
        using T = decltype(value);
        if constexpr (std::is_same_v<T, Pooling>) {
          items.push_back(fmt::format("{}={}", key, pooling_name(value)));
        } else if constexpr (std::is_same_v<T, double>) {
          items.push_back(fmt::format("{}={}", key, number_text(value)));
        } else {
          items.push_back(fmt::format("{}={}", key, value));
        }
      },
      except);
}

template <typename Spec>
void json_params(std::span<const Param<Spec>> params, const Spec& spec, Json& object,
                 std::span<const std::string_view> except = {}) {
  for_each_shown(
      params, spec,
      [&](std::string_view key, auto value) {
        if constexpr (std::is_same_v<decltype(value), Pooling>) {
          object[std::string(key)] = pooling_name(value);
        } else {
          object[std::string(key)] = value;
        }
      },
      except);
}

// A policy whose parameters are another's (its base's: lserve's quest heads, the scored policy
// pyramidkv and adakv wrap), less `base_except`, then its own.
template <typename Spec, typename Base>
struct LayeredParams {
  std::span<const Param<Base>> base;
  std::span<const Param<Spec>> own;
  std::span<const std::string_view> base_except = {};

  std::vector<std::string_view> keys() const {
    std::vector<std::string_view> out = param_keys(base, base_except);
    for (std::string_view key : param_keys(own)) out.push_back(key);
    return out;
  }
  void read(const GivenParams& given, Base& base_spec, Spec& spec) const {
    read_params(base, given, base_spec, base_except);
    read_params(own, given, spec);
  }
  void check(const Base& base_spec, const Spec& spec, std::string_view policy) const {
    check_params(base, base_spec, policy);
    check_params(own, spec, policy);
  }
  void print(const Base& base_spec, const Spec& spec, std::vector<std::string>& items) const {
    print_params(base, base_spec, items, base_except);
    print_params(own, spec, items);
  }
  void json(const Base& base_spec, const Spec& spec, Json& object) const {
    json_params(base, base_spec, object, base_except);
    json_params(own, spec, object);
  }
};

// "NAME" or "NAME:a,b,...".
std::string policy_text(std::string_view name, const std::vector<std::string>& items);

}  // namespace sieve::sparsity
