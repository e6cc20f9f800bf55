// Policy strings and JSON <-> PolicySpec, validation, and resolution to a per-head plan.
#include "sparsity/policy_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cctype>
#include <charconv>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <utility>

#include "sparsity/calibration.h"
#include "util/error.h"

namespace sieve::sparsity {

namespace {

// ------------------------------------------------------------------------------ the parser

// One item of a policy's parameter list, split at top-level commas.
struct Item {
  std::string_view key;    // empty for a group item
  std::string_view value;  // after '=' (or the whole group item)
};

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

// The KEY=VALUE parameters of a leaf policy, each taken once.
class Params {
 public:
  Params(std::string_view policy, const std::vector<Item>& items,
         std::vector<std::string_view> allowed)
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
  std::optional<std::string_view> get(std::string_view key) const {
    const auto it = values_.find(key);
    if (it == values_.end()) return std::nullopt;
    return it->second;
  }
  int64_t get_int(std::string_view key, std::optional<int64_t> fallback,
                  std::string_view meaning) const {
    if (const auto value = get(key)) return parse_int(policy_, key, *value);
    if (!fallback) fail("{}: missing {} ({})", policy_, key, meaning);
    return *fallback;
  }
  double get_double(std::string_view key, double fallback) const {
    if (const auto value = get(key)) return parse_double(policy_, key, *value);
    return fallback;
  }

 private:
  std::string_view policy_;
  std::map<std::string_view, std::string_view> values_;
};

PolicySpec parse_node(std::string_view text);

SnapKvSpec parse_snapkv_params(std::string_view name, const Params& params) {
  SnapKvSpec spec;
  spec.budget = params.get_int("B", std::nullopt, "the token budget");
  spec.window = params.get_int("W", spec.window, "");
  spec.pool_kernel = params.get_int("P", spec.pool_kernel, "");
  spec.follow = params.get_int("G", spec.follow, "");
  if (const auto pool = params.get("pool")) {
    if (*pool == "max") {
      spec.pooling = Pooling::kMax;
    } else if (*pool == "avg") {
      spec.pooling = Pooling::kAvg;
    } else {
      fail("{}: pool must be max or avg, got \"{}\"", name, *pool);
    }
  }
  return spec;
}

// snapkv's parameters plus one of the policy's own (pyramidkv's beta, adakv's alpha).
template <typename Spec>
Spec parse_snapkv_plus(std::string_view name, const std::vector<Item>& items, std::string_view key,
                       double Spec::*extra, bool takes_follow) {
  std::vector<std::string_view> allowed = {"B", "W", "P", "pool", key};
  if (takes_follow) allowed.push_back("G");
  const Params params(name, items, std::move(allowed));
  Spec spec;
  spec.snapkv = parse_snapkv_params(name, params);
  spec.*extra = params.get_double(key, spec.*extra);
  return spec;
}

QuestSpec parse_quest_params(const Params& params) {
  QuestSpec spec;
  spec.top_k_pages = params.get_int("K", std::nullopt, "pages read per decode step");
  spec.reuse_steps = params.get_int("R", spec.reuse_steps, "");
  spec.num_sinks = params.get_int("S", spec.num_sinks, "");
  spec.window = params.get_int("W", spec.window, "");
  return spec;
}

// The groups and `rest` of heads: / layers:.
template <typename Group, typename MakeGroup>
std::vector<Group> parse_groups(std::string_view name, const std::vector<Item>& items,
                                Box<PolicySpec>& rest, MakeGroup make_group) {
  std::vector<Group> groups;
  bool has_rest = false;
  for (const Item& item : items) {
    if (item.key == "rest") {
      rest = parse_node(strip_parens(item.value, name));
      has_rest = true;
      continue;
    }
    if (item.key.find(':') != std::string_view::npos) {
      fail("{}: a group's policy with parameters goes in parentheses: (POLICY:...)@SELECTOR", name);
    }
    if (!item.key.empty()) {
      fail("{}: unknown parameter \"{}\" (expected groups and rest)", name, item.key);
    }
    if (has_rest) fail("{}: rest must come last", name);
    const size_t close = item.value.front() == '(' ? matching_paren(item.value, 0, name) : 0;
    const size_t at = item.value.find('@', close);
    if (at == std::string_view::npos) {
      fail("{}: group \"{}\" needs '@' and a selector", name, item.value);
    }
    const std::string_view policy_text = strip_parens(item.value.substr(0, at), name);
    if (policy_text.empty()) fail("{}: group \"{}\" names no policy", name, item.value);
    groups.push_back(make_group(parse_node(policy_text), item.value.substr(at + 1)));
  }
  if (groups.empty()) fail("{}: needs at least one group (POLICY@SELECTOR)", name);
  return groups;
}

PolicySpec parse_node(std::string_view text) {
  if (text.empty()) fail("empty policy");
  const size_t colon = text.find(':');
  const std::string_view name = text.substr(0, colon);
  const std::string_view rest =
      colon == std::string_view::npos ? std::string_view() : text.substr(colon + 1);
  if (colon != std::string_view::npos && rest.empty()) fail("{}: nothing after ':'", name);
  const std::vector<Item> items = rest.empty() ? std::vector<Item>() : split_items(rest, name);

  if (name == "full") {
    Params(name, items, {});
    return {FullSpec{}};
  }
  if (name == "streaming") {
    const Params params(name, items, {"S", "W"});
    StreamingSpec spec;
    spec.num_sinks = params.get_int("S", spec.num_sinks, "");
    spec.window = params.get_int("W", spec.window, "");
    return {spec};
  }
  if (name == "h2o") {
    const Params params(name, items, {"B", "W"});
    H2OSpec spec;
    spec.heavy_budget = params.get_int("B", std::nullopt, "the heavy-hitter budget in tokens");
    spec.window = params.get_int("W", spec.window, "");
    return {spec};
  }
  if (name == "snapkv") {
    return {parse_snapkv_params(name, Params(name, items, {"B", "W", "P", "pool", "G"}))};
  }
  if (name == "pyramidkv") {
    return {parse_snapkv_plus(name, items, "beta", &PyramidKvSpec::beta, /*takes_follow=*/true)};
  }
  // Ada-KV ranks pooled scores across its heads: no G.
  if (name == "adakv") {
    return {parse_snapkv_plus(name, items, "alpha", &AdaKvSpec::alpha, /*takes_follow=*/false)};
  }
  if (name == "fastgen") {
    const Params params(name, items, {"T", "W", "F"});
    FastGenSpec spec;
    spec.threshold = params.get_double("T", spec.threshold);
    spec.local_window = params.get_int("W", spec.local_window, "");
    spec.frequent_fraction = params.get_double("F", spec.frequent_fraction);
    return {spec};
  }
  if (name == "quest") return {parse_quest_params(Params(name, items, {"K", "R", "S", "W"}))};
  if (name == "lserve") {
    const Params params(name, items, {"K", "R", "S", "W", "f", "t"});
    LServeSpec spec;
    spec.quest = parse_quest_params(params);
    if (!params.get("R")) spec.quest.reuse_steps = 4;  // LServe reuses a selection by default
    spec.streaming_fraction = params.get_double("f", spec.streaming_fraction);
    spec.min_streaming_score = params.get_double("t", spec.min_streaming_score);
    return {spec};
  }
  if (name == "layerwise") {
    std::vector<Item> leaf_items;
    std::optional<std::string_view> rest_text;
    for (const Item& item : items) {
      if (item.key == "rest") {
        rest_text = item.value;
      } else {
        leaf_items.push_back(item);
      }
    }
    const Params params(name, leaf_items, {"L", "rest"});
    LayerwiseSpec spec;
    spec.num_full_layers = params.get_int("L", std::nullopt, "the number of dense first layers");
    if (!rest_text) fail("{}: missing rest (the policy of the other layers)", name);
    spec.rest = parse_node(strip_parens(*rest_text, name));
    return {std::move(spec)};
  }
  if (name == "heads") {
    HeadsSpec spec;
    spec.groups = parse_groups<HeadGroup>(
        name, items, spec.rest, [&](PolicySpec policy, std::string_view selector) {
          HeadGroup group{std::move(policy), ProfileFraction{}};
          if (selector.starts_with("profile=")) {
            group.selector = ProfileFraction{parse_double(name, "profile", selector.substr(8))};
          } else if (selector.starts_with("kv=")) {
            group.selector = parse_index_list(name, "kv", selector.substr(3));
          } else {
            fail("{}: selector must be profile=FRACTION or kv=LIST, got \"{}\"", name, selector);
          }
          return group;
        });
    return {std::move(spec)};
  }
  if (name == "layers") {
    LayersSpec spec;
    spec.groups = parse_groups<LayerGroup>(
        name, items, spec.rest, [&](PolicySpec policy, std::string_view selector) {
          return LayerGroup{std::move(policy), parse_index_list(name, "layers", selector)};
        });
    return {std::move(spec)};
  }
  fail(
      "unknown policy \"{}\" (expected full, streaming, h2o, snapkv, pyramidkv, adakv, layerwise, "
      "fastgen, quest, lserve, heads, layers)",
      name);
}

// ------------------------------------------------------------------------------ validation

void check(bool ok, std::string_view policy, std::string_view what) {
  if (!ok) fail("{}: {}", policy, what);
}

void check_fraction(double value, std::string_view policy, std::string_view key) {
  if (!(value >= 0.0 && value <= 1.0)) fail("{}: {} must be in [0, 1], got {}", policy, key, value);
}

void validate_snapkv(const SnapKvSpec& spec, std::string_view name) {
  check(spec.budget >= 1, name, "B must be >= 1");
  check(spec.window >= 1, name, "W (the observation window) must be >= 1");
  check(spec.pool_kernel >= 1 && spec.pool_kernel % 2 == 1, name, "P must be odd and >= 1");
  check(spec.follow >= 0, name, "G must be >= 0");
}

void validate_quest(const QuestSpec& spec, std::string_view name) {
  check(spec.top_k_pages >= 1, name, "K must be >= 1");
  check(spec.reuse_steps >= 1, name, "R must be >= 1");
}

struct Validator {
  void operator()(const FullSpec&) const {}
  void operator()(const StreamingSpec& s) const {
    check(s.window >= 1, "streaming", "W must be >= 1");
  }
  void operator()(const H2OSpec& s) const { check(s.heavy_budget >= 1, "h2o", "B must be >= 1"); }
  void operator()(const SnapKvSpec& s) const { validate_snapkv(s, "snapkv"); }
  void operator()(const PyramidKvSpec& s) const {
    validate_snapkv(s.snapkv, "pyramidkv");
    if (!(std::isfinite(s.beta) && s.beta >= 1.0)) {
      fail("pyramidkv: beta must be >= 1 (1 = uniform budgets), got {}", s.beta);
    }
  }
  void operator()(const AdaKvSpec& s) const {
    validate_snapkv(s.snapkv, "adakv");
    check_fraction(s.alpha, "adakv", "alpha");
  }
  void operator()(const FastGenSpec& s) const {
    if (!(s.threshold >= 0.0 && s.threshold < 1.0)) {
      fail("fastgen: T must be in [0, 1), got {}", s.threshold);
    }
    check(s.local_window >= 1, "fastgen", "W must be >= 1");
    check_fraction(s.frequent_fraction, "fastgen", "F");
  }
  void operator()(const QuestSpec& s) const { validate_quest(s, "quest"); }
  void operator()(const LServeSpec& s) const {
    validate_quest(s.quest, "lserve");
    check_fraction(s.streaming_fraction, "lserve", "f");
    check_fraction(s.min_streaming_score, "lserve", "t");
    check(s.streaming_fraction == 0.0 || s.quest.window >= 1, "lserve",
          "W must be >= 1 when f > 0 (the streaming heads' window)");
  }
  void operator()(const LayerwiseSpec& s) const { validate(*s.rest); }
  void operator()(const HeadsSpec& s) const {
    check(!s.groups.empty(), "heads", "needs at least one group");
    for (const HeadGroup& group : s.groups) {
      validate(*group.policy);
      if (const auto* fraction = std::get_if<ProfileFraction>(&group.selector)) {
        check_fraction(fraction->fraction, "heads", "profile");
      } else {
        check(!std::get<IndexList>(group.selector).indices.empty(), "heads", "empty kv list");
      }
    }
    validate(*s.rest);
  }
  void operator()(const LayersSpec& s) const {
    check(!s.groups.empty(), "layers", "needs at least one group");
    for (const LayerGroup& group : s.groups) {
      validate(*group.policy);
      check(!group.layers.indices.empty(), "layers", "empty layer list");
    }
    validate(*s.rest);
  }
};

// ------------------------------------------------------------------------------ printing

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

std::string_view pooling_name(Pooling pooling) { return pooling == Pooling::kMax ? "max" : "avg"; }

std::string snapkv_params(const SnapKvSpec& s) {
  return fmt::format("B={},W={},P={},pool={}{}", s.budget, s.window, s.pool_kernel,
                     pooling_name(s.pooling), s.follow > 0 ? fmt::format(",G={}", s.follow) : "");
}

std::string quest_params(const QuestSpec& s) {
  return fmt::format("K={},R={},S={},W={}", s.top_k_pages, s.reuse_steps, s.num_sinks, s.window);
}

struct Printer {
  std::string operator()(const FullSpec&) const { return "full"; }
  std::string operator()(const StreamingSpec& s) const {
    return fmt::format("streaming:S={},W={}", s.num_sinks, s.window);
  }
  std::string operator()(const H2OSpec& s) const {
    return fmt::format("h2o:B={},W={}", s.heavy_budget, s.window);
  }
  std::string operator()(const SnapKvSpec& s) const { return "snapkv:" + snapkv_params(s); }
  std::string operator()(const PyramidKvSpec& s) const {
    return fmt::format("pyramidkv:{},beta={}", snapkv_params(s.snapkv), s.beta);
  }
  std::string operator()(const AdaKvSpec& s) const {
    return fmt::format("adakv:{},alpha={}", snapkv_params(s.snapkv), s.alpha);
  }
  std::string operator()(const FastGenSpec& s) const {
    return fmt::format("fastgen:T={},W={},F={}", s.threshold, s.local_window, s.frequent_fraction);
  }
  std::string operator()(const QuestSpec& s) const { return "quest:" + quest_params(s); }
  std::string operator()(const LServeSpec& s) const {
    std::string out = fmt::format("lserve:{},f={}", quest_params(s.quest), s.streaming_fraction);
    if (s.min_streaming_score > 0) out += fmt::format(",t={}", s.min_streaming_score);
    return out;
  }
  std::string operator()(const LayerwiseSpec& s) const {
    return fmt::format("layerwise:L={},rest={}", s.num_full_layers, to_string(*s.rest));
  }
  std::string operator()(const HeadsSpec& s) const {
    std::string out = "heads:";
    for (const HeadGroup& group : s.groups) {
      out += fmt::format("({})@", to_string(*group.policy));
      if (const auto* fraction = std::get_if<ProfileFraction>(&group.selector)) {
        out += fmt::format("profile={}", fraction->fraction);
      } else {
        out += "kv=" + index_list_string(std::get<IndexList>(group.selector));
      }
      out += ',';
    }
    return out + "rest=" + to_string(*s.rest);
  }
  std::string operator()(const LayersSpec& s) const {
    std::string out = "layers:";
    for (const LayerGroup& group : s.groups) {
      out += fmt::format("({})@{},", to_string(*group.policy), index_list_string(group.layers));
    }
    return out + "rest=" + to_string(*s.rest);
  }
};

// ------------------------------------------------------------------------------ JSON

using Json = nlohmann::json;

Json to_json_value(const PolicySpec& spec) {
  struct Visitor {
    Json operator()(const FullSpec&) const { return {{"name", "full"}}; }
    Json operator()(const StreamingSpec& s) const {
      return {{"name", "streaming"}, {"S", s.num_sinks}, {"W", s.window}};
    }
    Json operator()(const H2OSpec& s) const {
      return {{"name", "h2o"}, {"B", s.heavy_budget}, {"W", s.window}};
    }
    static Json snapkv(std::string_view name, const SnapKvSpec& s) {
      Json j = {{"name", name},
                {"B", s.budget},
                {"W", s.window},
                {"P", s.pool_kernel},
                {"pool", pooling_name(s.pooling)}};
      if (s.follow > 0) j["G"] = s.follow;
      return j;
    }
    Json operator()(const SnapKvSpec& s) const { return snapkv("snapkv", s); }
    Json operator()(const PyramidKvSpec& s) const {
      Json j = snapkv("pyramidkv", s.snapkv);
      j["beta"] = s.beta;
      return j;
    }
    Json operator()(const AdaKvSpec& s) const {
      Json j = snapkv("adakv", s.snapkv);
      j["alpha"] = s.alpha;
      return j;
    }
    Json operator()(const FastGenSpec& s) const {
      return {{"name", "fastgen"},
              {"T", s.threshold},
              {"W", s.local_window},
              {"F", s.frequent_fraction}};
    }
    static Json quest(std::string_view name, const QuestSpec& s) {
      return {{"name", name},
              {"K", s.top_k_pages},
              {"R", s.reuse_steps},
              {"S", s.num_sinks},
              {"W", s.window}};
    }
    Json operator()(const QuestSpec& s) const { return quest("quest", s); }
    Json operator()(const LServeSpec& s) const {
      Json j = quest("lserve", s.quest);
      j["f"] = s.streaming_fraction;
      if (s.min_streaming_score > 0) j["t"] = s.min_streaming_score;
      return j;
    }
    Json operator()(const LayerwiseSpec& s) const {
      return {{"name", "layerwise"}, {"L", s.num_full_layers}, {"rest", to_json_value(*s.rest)}};
    }
    Json operator()(const HeadsSpec& s) const {
      Json groups = Json::array();
      for (const HeadGroup& group : s.groups) {
        Json g = {{"policy", to_json_value(*group.policy)}};
        if (const auto* fraction = std::get_if<ProfileFraction>(&group.selector)) {
          g["profile"] = fraction->fraction;
        } else {
          g["kv"] = std::get<IndexList>(group.selector).indices;
        }
        groups.push_back(std::move(g));
      }
      return {{"name", "heads"}, {"groups", groups}, {"rest", to_json_value(*s.rest)}};
    }
    Json operator()(const LayersSpec& s) const {
      Json groups = Json::array();
      for (const LayerGroup& group : s.groups) {
        groups.push_back(
            {{"policy", to_json_value(*group.policy)}, {"layers", group.layers.indices}});
      }
      return {{"name", "layers"}, {"groups", groups}, {"rest", to_json_value(*s.rest)}};
    }
  };
  return std::visit(Visitor{}, spec.policy);
}

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

// JSON -> the equivalent policy string (then parsed by the one parser).
std::string json_to_policy_text(const Json& value, std::string_view where);

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

std::string json_to_policy_text(const Json& value, std::string_view where) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object()) return json_object_to_policy_text(value, where);
  fail("{}: a policy must be a string or an object, got {}", where, value.dump());
}

// ------------------------------------------------------------------------------ resolution

struct Cell {
  int64_t layer = 0;
  int64_t kv_head = 0;
};

class Resolver {
 public:
  Resolver(const ModelShape& shape, const CalibrationProfile* profile)
      : shape_(shape), profile_(profile) {
    plan_.shape = shape;
    assigned_.assign(static_cast<size_t>(shape.num_layers * shape.num_kv_heads), false);
    plan_.heads.assign(assigned_.size(), DenseHead{});
  }

  void assign(const PolicySpec& spec, const std::vector<Cell>& cells) {
    std::visit([&](const auto& s) { assign_node(s, cells); }, spec.policy);
  }

  SparsityPlan finish() {
    assert(std::all_of(assigned_.begin(), assigned_.end(), [](bool b) { return b; }));
    return std::move(plan_);
  }

 private:
  void set(const Cell& cell, HeadPolicy head) {
    const auto idx = static_cast<size_t>(cell.layer * shape_.num_kv_heads + cell.kv_head);
    assert(!assigned_[idx]);
    assigned_[idx] = true;
    plan_.heads[idx] = std::move(head);
  }
  void set_all(const std::vector<Cell>& cells, const HeadPolicy& head) {
    for (const Cell& cell : cells) set(cell, head);
  }

  // The round(fraction * scope) most streaming-like of `candidates`.
  std::vector<Cell> most_streaming(const std::vector<Cell>& candidates, double fraction,
                                   size_t scope, std::string_view who) {
    const auto count =
        std::min(candidates.size(),
                 static_cast<size_t>(std::llround(fraction * static_cast<double>(scope))));
    if (count == 0) return {};
    if (profile_ == nullptr) {
      fail(
          "{} selects streaming heads from a calibration profile, but none was given (write one "
          "with `sieve calibrate`)",
          who);
    }
    std::vector<Cell> sorted = candidates;
    std::stable_sort(sorted.begin(), sorted.end(), [&](const Cell& a, const Cell& b) {
      const double sa = profile_->score(a.layer, a.kv_head);
      const double sb = profile_->score(b.layer, b.kv_head);
      if (sa != sb) return sa > sb;
      return std::pair(a.layer, a.kv_head) < std::pair(b.layer, b.kv_head);
    });
    sorted.resize(count);
    return sorted;
  }

  static std::vector<Cell> without(const std::vector<Cell>& cells, const std::vector<Cell>& drop) {
    std::vector<Cell> out;
    for (const Cell& c : cells) {
      const bool dropped = std::any_of(drop.begin(), drop.end(), [&](const Cell& d) {
        return d.layer == c.layer && d.kv_head == c.kv_head;
      });
      if (!dropped) out.push_back(c);
    }
    return out;
  }

  // The leaf policies are their own head policies.
  void assign_node(const FullSpec& s, const std::vector<Cell>& cells) { set_all(cells, s); }
  void assign_node(const StreamingSpec& s, const std::vector<Cell>& cells) { set_all(cells, s); }
  void assign_node(const H2OSpec& s, const std::vector<Cell>& cells) { set_all(cells, s); }
  void assign_node(const SnapKvSpec& s, const std::vector<Cell>& cells) { set_all(cells, s); }
  void assign_node(const AdaKvSpec& s, const std::vector<Cell>& cells) { set_all(cells, s); }
  void assign_node(const FastGenSpec& s, const std::vector<Cell>& cells) { set_all(cells, s); }
  void assign_node(const QuestSpec& s, const std::vector<Cell>& cells) { set_all(cells, s); }
  void assign_node(const PyramidKvSpec& s, const std::vector<Cell>& cells) {
    std::vector<int64_t> layers;
    for (const Cell& c : cells) layers.push_back(c.layer);
    std::sort(layers.begin(), layers.end());
    layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
    const std::vector<int64_t> budgets =
        pyramid_budgets(s.snapkv.budget, s.beta, static_cast<int64_t>(layers.size()));
    for (const Cell& c : cells) {
      const auto rank = std::lower_bound(layers.begin(), layers.end(), c.layer) - layers.begin();
      SnapKvSpec layer_spec = s.snapkv;
      layer_spec.budget = budgets[static_cast<size_t>(rank)];
      set(c, layer_spec);
    }
  }
  void assign_node(const LServeSpec& s, const std::vector<Cell>& cells) {
    std::vector<Cell> streaming =
        most_streaming(cells, s.streaming_fraction, cells.size(), "lserve");
    std::erase_if(streaming, [&](const Cell& c) {
      return profile_->score(c.layer, c.kv_head) < s.min_streaming_score;
    });
    set_all(streaming, StreamingSpec{.num_sinks = s.quest.num_sinks, .window = s.quest.window});
    set_all(without(cells, streaming), s.quest);
  }
  void assign_node(const LayerwiseSpec& s, const std::vector<Cell>& cells) {
    std::vector<Cell> dense, rest;
    for (const Cell& c : cells) (c.layer < s.num_full_layers ? dense : rest).push_back(c);
    set_all(dense, DenseHead{});
    if (!rest.empty()) assign(*s.rest, rest);
  }
  void assign_node(const HeadsSpec& s, const std::vector<Cell>& cells) {
    std::vector<Cell> remaining = cells;
    std::vector<bool> listed(static_cast<size_t>(shape_.num_kv_heads), false);
    for (const HeadGroup& group : s.groups) {
      std::vector<Cell> claimed;
      if (const auto* fraction = std::get_if<ProfileFraction>(&group.selector)) {
        claimed = most_streaming(remaining, fraction->fraction, cells.size(), "heads:profile");
      } else {
        for (int64_t head : std::get<IndexList>(group.selector).indices) {
          if (head >= shape_.num_kv_heads) {
            fail("heads: kv head {} out of range (the model has {} KV heads)", head,
                 shape_.num_kv_heads);
          }
          if (listed[static_cast<size_t>(head)]) fail("heads: kv head {} is in two groups", head);
          listed[static_cast<size_t>(head)] = true;
          for (const Cell& c : remaining) {
            if (c.kv_head == head) claimed.push_back(c);
          }
        }
      }
      remaining = without(remaining, claimed);
      if (!claimed.empty()) assign(*group.policy, claimed);
    }
    if (!remaining.empty()) assign(*s.rest, remaining);
  }
  void assign_node(const LayersSpec& s, const std::vector<Cell>& cells) {
    std::vector<Cell> remaining = cells;
    std::vector<bool> listed(static_cast<size_t>(shape_.num_layers), false);
    for (const LayerGroup& group : s.groups) {
      std::vector<Cell> claimed;
      for (int64_t layer : group.layers.indices) {
        if (layer >= shape_.num_layers) {
          fail("layers: layer {} out of range (the model has {} layers)", layer, shape_.num_layers);
        }
        if (listed[static_cast<size_t>(layer)]) fail("layers: layer {} is in two groups", layer);
        listed[static_cast<size_t>(layer)] = true;
        for (const Cell& c : remaining) {
          if (c.layer == layer) claimed.push_back(c);
        }
      }
      remaining = without(remaining, claimed);
      if (!claimed.empty()) assign(*group.policy, claimed);
    }
    if (!remaining.empty()) assign(*s.rest, remaining);
  }

  ModelShape shape_;
  const CalibrationProfile* profile_;
  SparsityPlan plan_;
  std::vector<bool> assigned_;
};

}  // namespace

PolicySpec parse_policy(std::string_view text) {
  if (text.empty()) fail("invalid KV policy: empty string");
  if (std::any_of(text.begin(), text.end(),
                  [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; })) {
    fail("invalid KV policy \"{}\": no spaces allowed", text);
  }
  try {
    PolicySpec spec = parse_node(text);
    validate(spec);
    return spec;
  } catch (const Error& e) {
    fail("invalid KV policy \"{}\": {}", text, e.what());
  }
}

PolicySpec parse_policy_json(std::string_view json_text) {
  Json value;
  try {
    value = Json::parse(json_text);
  } catch (const Json::exception& e) {
    fail("invalid KV policy JSON: {}", e.what());
  }
  return parse_policy(json_to_policy_text(value, "kv_policy"));
}

std::string to_string(const PolicySpec& spec) { return std::visit(Printer{}, spec.policy); }

std::string to_json(const PolicySpec& spec) { return to_json_value(spec).dump(); }

void validate(const PolicySpec& spec) { std::visit(Validator{}, spec.policy); }

std::vector<int64_t> pyramid_budgets(int64_t mean_budget, double beta, int64_t num_layers) {
  if (num_layers <= 0) return {};
  if (num_layers == 1) return {mean_budget};
  const double mean = static_cast<double>(mean_budget);
  const double top = mean / beta;
  const double bottom = 2.0 * mean - top;
  std::vector<int64_t> budgets(static_cast<size_t>(num_layers));
  std::vector<std::pair<double, int64_t>> remainders;  // (fraction, layer)
  int64_t total = 0;
  for (int64_t l = 0; l < num_layers; ++l) {
    const double exact =
        bottom - (bottom - top) * static_cast<double>(l) / static_cast<double>(num_layers - 1);
    const double floor = std::floor(exact);
    budgets[static_cast<size_t>(l)] = static_cast<int64_t>(floor);
    total += budgets[static_cast<size_t>(l)];
    remainders.emplace_back(exact - floor, l);
  }
  // Largest remainders first, ties to the lower layer.
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  int64_t missing = num_layers * mean_budget - total;
  for (size_t i = 0; missing > 0; i = (i + 1) % remainders.size(), --missing) {
    ++budgets[static_cast<size_t>(remainders[i].second)];
  }
  return budgets;
}

SparsityPlan resolve(const PolicySpec& spec, const ModelShape& shape,
                     const CalibrationProfile* profile) {
  if (shape.num_layers <= 0 || shape.num_kv_heads <= 0) {
    fail("KV policy: the model shape must have layers and KV heads (got {} x {})", shape.num_layers,
         shape.num_kv_heads);
  }
  validate(spec);
  if (profile != nullptr &&
      (profile->num_layers != shape.num_layers || profile->num_kv_heads != shape.num_kv_heads)) {
    fail("calibration profile is for {} layers x {} KV heads, the model has {} x {}",
         profile->num_layers, profile->num_kv_heads, shape.num_layers, shape.num_kv_heads);
  }
  Resolver resolver(shape, profile);
  std::vector<Cell> cells;
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    for (int64_t h = 0; h < shape.num_kv_heads; ++h) cells.push_back({l, h});
  }
  resolver.assign(spec, cells);
  return resolver.finish();
}

bool SparsityPlan::is_dense() const {
  return std::all_of(heads.begin(), heads.end(),
                     [](const HeadPolicy& h) { return std::holds_alternative<DenseHead>(h); });
}

}  // namespace sieve::sparsity
