// Policy strings and JSON <-> PolicySpec, validation and resolution, through each policy's
// PolicyType (policy_type.h; one policy_<name>.cc each).
#include "sparsity/policy_spec.h"

#include <algorithm>
#include <cassert>
#include <cctype>

#include "sparsity/calibration.h"
#include "sparsity/policy_type.h"

namespace sieve::sparsity {

// Each defined in its policy_<name>.cc.
const PolicyType &full_policy_type(), &streaming_policy_type(), &h2o_policy_type(),
    &snapkv_policy_type(), &pyramidkv_policy_type(), &adakv_policy_type(), &keydiff_policy_type(),
    &layerwise_policy_type(), &fastgen_policy_type(), &quest_policy_type(), &lserve_policy_type(),
    &heads_policy_type(), &layers_policy_type();

std::span<const PolicyType* const> policy_types() {
  static const PolicyType* const types[] = {
      &full_policy_type(),    &streaming_policy_type(), &h2o_policy_type(),
      &snapkv_policy_type(),  &pyramidkv_policy_type(), &adakv_policy_type(),
      &keydiff_policy_type(), &layerwise_policy_type(), &fastgen_policy_type(),
      &quest_policy_type(),   &lserve_policy_type(),    &heads_policy_type(),
      &layers_policy_type(),
  };
  static_assert(std::size(types) == std::variant_size_v<decltype(PolicySpec::policy)>);
  return types;
}

const PolicyType* find_policy_type(std::string_view name) {
  for (const PolicyType* type : policy_types()) {
    if (type->name() == name) return type;
  }
  return nullptr;
}

const PolicyType& policy_type(const PolicySpec& spec) {
  static const std::vector<const PolicyType*> by_index = [] {
    std::vector<const PolicyType*> types(policy_types().size(), nullptr);
    for (const PolicyType* type : policy_types()) types[type->spec_index()] = type;
    return types;
  }();
  return *by_index[spec.policy.index()];
}

PolicySpec parse_node(std::string_view text) {
  if (text.empty()) fail("empty policy");
  const size_t colon = text.find(':');
  const std::string_view name = text.substr(0, colon);
  const std::string_view rest =
      colon == std::string_view::npos ? std::string_view() : text.substr(colon + 1);
  if (colon != std::string_view::npos && rest.empty()) fail("{}: nothing after ':'", name);
  const std::vector<Item> items = rest.empty() ? std::vector<Item>() : split_items(rest, name);
  const PolicyType* type = find_policy_type(name);
  if (type == nullptr) {
    std::vector<std::string_view> names;
    for (const PolicyType* t : policy_types()) names.push_back(t->name());
    fail("unknown policy \"{}\" (expected {})", name, fmt::join(names, ", "));
  }
  return type->parse(items);
}

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

std::string to_string(const PolicySpec& spec) { return policy_type(spec).print(spec); }

std::string to_json(const PolicySpec& spec) { return policy_type(spec).to_json(spec).dump(); }

void validate(const PolicySpec& spec) { policy_type(spec).validate(spec); }

std::string policy_for_budget(std::string_view name, const TokenBudget& budget) {
  const PolicyType* type = find_policy_type(name);
  if (type == nullptr || type->budget_pattern().empty()) {
    std::vector<std::string_view> names;
    for (const PolicyType* t : policy_types()) {
      if (!t->budget_pattern().empty()) names.push_back(t->name());
    }
    fail("{} policy '{}' (budget policies: {})", type ? "no budget for the" : "unknown", name,
         fmt::join(names, ", "));
  }
  const int64_t pages =
      std::max<int64_t>(2, (budget.keep_tokens + budget.page_size - 1) / budget.page_size);
  return fmt::format(fmt::runtime(type->budget_pattern()),
                     fmt::arg("budget", budget.keep_tokens - budget.window),
                     fmt::arg("window", budget.window), fmt::arg("recent", budget.keep_tokens - 4),
                     fmt::arg("pages", pages));
}

// ------------------------------------------------------------------------------ resolution

Resolver::Resolver(const ModelShape& shape, const CalibrationProfile* profile)
    : shape_(shape), profile_(profile) {
  plan_.shape = shape;
  assigned_.assign(static_cast<size_t>(shape.num_layers * shape.num_kv_heads), false);
  plan_.heads.assign(assigned_.size(), DenseHead{});
}

void Resolver::assign(const PolicySpec& spec, const std::vector<Cell>& cells) {
  policy_type(spec).resolve(spec, cells, *this);
}

void Resolver::set(const Cell& cell, HeadPolicy head) {
  const auto idx = static_cast<size_t>(cell.layer * shape_.num_kv_heads + cell.kv_head);
  assert(!assigned_[idx]);
  assigned_[idx] = true;
  plan_.heads[idx] = std::move(head);
}

void Resolver::set_all(const std::vector<Cell>& cells, const HeadPolicy& head) {
  for (const Cell& cell : cells) set(cell, head);
}

std::vector<Cell> Resolver::most_streaming(const std::vector<Cell>& candidates, double fraction,
                                           size_t scope, std::string_view who) const {
  const auto count = std::min(
      candidates.size(), static_cast<size_t>(std::llround(fraction * static_cast<double>(scope))));
  if (count == 0) return {};
  if (profile_ == nullptr) {
    fail(
        "{} selects streaming heads from a calibration profile, but none was given (write one "
        "with `sieve calibrate`)",
        who);
  }
  std::vector<Cell> sorted = candidates;
  std::stable_sort(sorted.begin(), sorted.end(), [&](const Cell& a, const Cell& b) {
    const double sa = streaming_score(a);
    const double sb = streaming_score(b);
    if (sa != sb) return sa > sb;
    return std::pair(a.layer, a.kv_head) < std::pair(b.layer, b.kv_head);
  });
  sorted.resize(count);
  return sorted;
}

double Resolver::streaming_score(const Cell& cell) const {
  return profile_->score(cell.layer, cell.kv_head);
}

std::vector<Cell> Resolver::without(const std::vector<Cell>& cells, const std::vector<Cell>& drop) {
  std::vector<Cell> out;
  for (const Cell& c : cells) {
    const bool dropped = std::any_of(drop.begin(), drop.end(), [&](const Cell& d) {
      return d.layer == c.layer && d.kv_head == c.kv_head;
    });
    if (!dropped) out.push_back(c);
  }
  return out;
}

SparsityPlan Resolver::finish() {
  assert(std::all_of(assigned_.begin(), assigned_.end(), [](bool b) { return b; }));
  return std::move(plan_);
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
