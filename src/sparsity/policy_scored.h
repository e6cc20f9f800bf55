#pragma once
// Internal to src/sparsity: the scored policies (ScoredSpec's alternatives: a budget of keys
// outside a recent window, ranked by a per-key score) split in two:
//   a scorer (KeyScorer): per stream, one score per key outside the window (SnapKV: pooled
//     observation attention); it says what it reads (observation rows, the keys);
//   a selector: which keys those scores keep. ScoredPolicy: each stream its own best `budget`
//     (snapkv, and pyramidkv's per-layer heads); Ada-KV (policy_adakv.cc): a layer's streams
//     share one budget.
// So a new scorer is one file (its spec, parameters and KeyScorer) and every selector takes it.
// The wrappers' grammar: the scored policy's parameters, then their own, then `score=NAME` where
// the scored policy is not the first (snapkv), e.g.
//   adakv:B=64,W=32,P=7,pool=max,alpha=0.2
#include <memory>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include "sparsity/policy_type.h"

namespace sieve::sparsity {

// Ranks one stream's keys for a keep-set.
class KeyScorer {
 public:
  virtual ~KeyScorer() = default;
  virtual int64_t observation_rows() const { return 0; }  // last prompt rows it reads
  virtual bool needs_keys() const { return false; }       // reads CompressInput::keys
  // Scores of keys [0, in.num_keys - window) (empty when there are none): higher keeps.
  virtual std::vector<float> score(const CompressInput& in) const = 0;
};

// Specialized for each ScoredSpec alternative, beside its policy.
template <typename Spec>
struct Scored;
template <>
struct Scored<SnapKvSpec> {
  static std::string_view name();
  static std::span<const Param<SnapKvSpec>> params();
  static std::shared_ptr<const KeyScorer> scorer(const SnapKvSpec& spec);
};
template <>
struct Scored<KeyDiffSpec> {
  static std::string_view name();
  static std::span<const Param<KeyDiffSpec>> params();
  static std::shared_ptr<const KeyScorer> scorer(const KeyDiffSpec& spec);
};
std::shared_ptr<const KeyScorer> make_scorer(const ScoredSpec& scored);

// One stream keeping its best `budget` keys by its scorer's scores, plus the window; tokens
// generated later are appended and kept.
class ScoredPolicy final : public CopyableStreamPolicy<ScoredPolicy> {
 public:
  explicit ScoredPolicy(const ScoredSpec& head);
  std::optional<int64_t> max_kept_tokens(int64_t, int64_t max_new_tokens) const override;
  int64_t observation_rows() const override { return scorer_->observation_rows(); }
  bool needs_keys() const override { return scorer_->needs_keys(); }
  CompressResult compress(const CompressInput& in) override;
  StreamReport report() const override;

 private:
  ScoredSpec head_;
  std::shared_ptr<const KeyScorer> scorer_;  // stateless: shared by copies
};

int64_t scored_budget(const ScoredSpec& scored);
void set_scored_budget(ScoredSpec& scored, int64_t budget);
int64_t scored_window(const ScoredSpec& scored);
std::string_view scored_name(const ScoredSpec& scored);

// The grammar of a policy Spec with a `ScoredSpec scored` member and its own parameters.
template <typename Spec>
class ScoredWrapper : public TypedPolicy<Spec> {
 public:
  ScoredWrapper(std::span<const Param<Spec>> own, std::span<const std::string_view> scored_except)
      : own_(own), except_(scored_except) {}

 protected:
  Spec parse_spec(std::span<const Item> items) const override {
    std::string_view scored_name = Scored<std::variant_alternative_t<0, ScoredSpec>>::name();
    for (const Item& item : items) {
      if (item.key == "score") scored_name = item.value;
    }
    Spec spec;
    spec.scored = scored_by_name(scored_name);
    std::visit(
        [&](auto& scored) {
          const auto params = layered(scored);
          std::vector<std::string_view> keys = params.keys();
          keys.push_back("score");
          params.read(GivenParams(this->name(), items, keys), scored, spec);
        },
        spec.scored);
    return spec;
  }
  void validate_spec(const Spec& spec) const override {
    std::visit([&](const auto& scored) { layered(scored).check(scored, spec, this->name()); },
               spec.scored);
  }
  std::string print_spec(const Spec& spec) const override {
    std::vector<std::string> items;
    std::visit([&](const auto& scored) { layered(scored).print(scored, spec, items); },
               spec.scored);
    if (spec.scored.index() != 0)
      items.push_back(fmt::format("score={}", scored_name(spec.scored)));
    return policy_text(this->name(), items);
  }
  Json json_spec(const Spec& spec) const override {
    Json object = {{"name", this->name()}};
    std::visit([&](const auto& scored) { layered(scored).json(scored, spec, object); },
               spec.scored);
    if (spec.scored.index() != 0) object["score"] = scored_name(spec.scored);
    return object;
  }

 private:
  template <typename Alt>
  LayeredParams<Spec, Alt> layered(const Alt&) const {
    return {Scored<Alt>::params(), own_, except_};
  }
  template <size_t I = 0>
  ScoredSpec scored_by_name(std::string_view name) const {
    if constexpr (I < std::variant_size_v<ScoredSpec>) {
      using Alt = std::variant_alternative_t<I, ScoredSpec>;
      if (Scored<Alt>::name() == name) return Alt{};
      return scored_by_name<I + 1>(name);
    } else {
      fail("{}: score must be one of {}, got \"{}\"", this->name(),
           names(std::make_index_sequence<std::variant_size_v<ScoredSpec>>()), name);
    }
  }

  template <size_t... I>
  static std::string names(std::index_sequence<I...>) {
    const std::string_view all[] = {Scored<std::variant_alternative_t<I, ScoredSpec>>::name()...};
    return fmt::format("{}", fmt::join(all, ", "));
  }

  std::span<const Param<Spec>> own_;
  std::span<const std::string_view> except_;
};

}  // namespace sieve::sparsity
