#pragma once
// Internal to src/sparsity: what one policy name is, in one place (policy_<name>.cc) — how it
// reads, checks, prints and writes as JSON (generic code over its parameter table for the leaf
// policies, policy_params.h), what it resolves to per (layer, KV head), the policy object a head
// holding it runs, and the policy string sieve eval uses for a budget.
//
// To add a policy: its spec struct in policy_spec.h (and its PolicySpec / HeadPolicy entries),
// one policy_<name>.cc defining a PolicyType, and its line in policy_types() (policy_spec.cc).
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsity/policy_params.h"
#include "sparsity/policy_spec.h"
#include "sparsity/stream_policy.h"

namespace sieve::sparsity {

struct Cell {
  int64_t layer = 0;
  int64_t kv_head = 0;
};

// Resolution's state: which head policy each (layer, KV head) got so far.
class Resolver {
 public:
  Resolver(const ModelShape& shape, const CalibrationProfile* profile);
  const ModelShape& shape() const { return shape_; }
  // `spec` decides for `cells` (its type's resolve()).
  void assign(const PolicySpec& spec, const std::vector<Cell>& cells);
  void set(const Cell& cell, HeadPolicy head);  // each cell once
  void set_all(const std::vector<Cell>& cells, const HeadPolicy& head);
  // The round(fraction * scope) most streaming-like of `candidates` by the calibration profile
  // (ties to the lower (layer, kv head)); throws naming `who` when there is no profile.
  std::vector<Cell> most_streaming(const std::vector<Cell>& candidates, double fraction,
                                   size_t scope, std::string_view who) const;
  double streaming_score(const Cell& cell) const;  // needs the profile
  static std::vector<Cell> without(const std::vector<Cell>& cells, const std::vector<Cell>& drop);
  SparsityPlan finish();

 private:
  ModelShape shape_;
  const CalibrationProfile* profile_;
  SparsityPlan plan_;
  std::vector<bool> assigned_;
};

class PolicyType {
 public:
  virtual ~PolicyType() = default;
  virtual std::string_view name() const = 0;
  // The PolicySpec alternative this type reads and prints (PolicySpec::policy.index()).
  virtual size_t spec_index() const = 0;
  // The items after "NAME:" (none: empty). Not validated yet.
  virtual PolicySpec parse(std::span<const Item> items) const = 0;
  virtual void validate(const PolicySpec& spec) const = 0;
  virtual std::string print(const PolicySpec& spec) const = 0;  // canonical
  virtual Json to_json(const PolicySpec& spec) const = 0;
  virtual void resolve(const PolicySpec& spec, const std::vector<Cell>& cells,
                       Resolver& resolver) const = 0;
  // The policy object of `num_members` streams holding `head` (this type's spec as resolved);
  // num_members is 1 unless decides_per_layer().
  virtual std::unique_ptr<GroupPolicy> make_group(const PolicySpec& head,
                                                  size_t num_members) const = 0;
  // Whether the streams of one layer holding equal heads decide together (Ada-KV).
  virtual bool decides_per_layer() const { return false; }
  // sieve eval's policy string for a budget (policy_for_budget()), a pattern of TokenBudget's
  // numbers: {budget} = keep_tokens - window (B of the scored policies), {window}, {recent} =
  // keep_tokens - 4 (a window after 4 sinks), {pages} (quest: the pages keep_tokens fill, at
  // least 2). Empty: the policy takes no budget (fastgen takes a threshold).
  virtual std::string_view budget_pattern() const { return {}; }
};

// Every policy type, in the order error messages list them.
std::span<const PolicyType* const> policy_types();
const PolicyType* find_policy_type(std::string_view name);  // null: none
const PolicyType& policy_type(const PolicySpec& spec);

// lserve's dynamic heads are quest heads, with quest's parameters.
std::span<const Param<QuestSpec>> quest_params();

// The attention mass of scores[keep] over all of it; 1 when the total is 0.
double kept_mass_ratio(std::span<const float> scores, std::span<const int32_t> keep);

// A StreamPolicy as a group of one.
std::unique_ptr<GroupPolicy> single_stream(std::unique_ptr<StreamPolicy> policy);

// The part of a PolicyType that knows its spec's C++ type.
template <typename Spec>
class TypedPolicy : public PolicyType {
 public:
  size_t spec_index() const final { return PolicySpec{Spec{}}.policy.index(); }
  PolicySpec parse(std::span<const Item> items) const final { return {parse_spec(items)}; }
  void validate(const PolicySpec& spec) const final { validate_spec(std::get<Spec>(spec.policy)); }
  std::string print(const PolicySpec& spec) const final {
    return print_spec(std::get<Spec>(spec.policy));
  }
  Json to_json(const PolicySpec& spec) const final {
    return json_spec(std::get<Spec>(spec.policy));
  }
  void resolve(const PolicySpec& spec, const std::vector<Cell>& cells,
               Resolver& resolver) const override {
    if constexpr (std::is_constructible_v<HeadPolicy, Spec>) {
      resolver.set_all(cells, std::get<Spec>(spec.policy));  // a leaf is its own head policy
    } else {
      resolve_spec(std::get<Spec>(spec.policy), cells, resolver);
    }
  }
  std::unique_ptr<GroupPolicy> make_group(const PolicySpec& head,
                                          size_t num_members) const override {
    return make_group_for(std::get<Spec>(head.policy), num_members);
  }

 protected:
  virtual Spec parse_spec(std::span<const Item> items) const = 0;
  virtual void validate_spec(const Spec& spec) const = 0;
  virtual std::string print_spec(const Spec& spec) const = 0;
  virtual Json json_spec(const Spec& spec) const = 0;
  // Compositions and policies that resolve to other heads.
  virtual void resolve_spec(const Spec&, const std::vector<Cell>&, Resolver&) const {}
  // Head policies: the policy object (a single stream's by default).
  virtual std::unique_ptr<GroupPolicy> make_group_for(const Spec& head, size_t) const {
    return single_stream(make_stream(head));
  }
  virtual std::unique_ptr<StreamPolicy> make_stream(const Spec&) const { return nullptr; }
};

// A policy whose grammar is its parameter table (NAME:KEY=VALUE,...) and whose heads each run
// a `Policy` (a StreamPolicy made from the head's spec).
template <typename Spec, typename Policy>
class LeafPolicy final : public TypedPolicy<Spec> {
 public:
  LeafPolicy(std::string_view name, std::span<const Param<Spec>> params,
             std::string_view budget_pattern = {})
      : name_(name), params_(params), budget_pattern_(budget_pattern) {}
  std::string_view name() const override { return name_; }
  std::string_view budget_pattern() const override { return budget_pattern_; }

 protected:
  Spec parse_spec(std::span<const Item> items) const override {
    const GivenParams given(name_, items, param_keys(params_));
    Spec spec{};
    read_params(params_, given, spec);
    return spec;
  }
  void validate_spec(const Spec& spec) const override { check_params(params_, spec, name_); }
  std::string print_spec(const Spec& spec) const override {
    std::vector<std::string> items;
    print_params(params_, spec, items);
    return policy_text(name_, items);
  }
  Json json_spec(const Spec& spec) const override {
    Json object = {{"name", name_}};
    json_params(params_, spec, object);
    return object;
  }
  std::unique_ptr<StreamPolicy> make_stream(const Spec& head) const override {
    return std::make_unique<Policy>(head);
  }

 private:
  std::string_view name_;
  std::span<const Param<Spec>> params_;
  std::string_view budget_pattern_;
};

}  // namespace sieve::sparsity
