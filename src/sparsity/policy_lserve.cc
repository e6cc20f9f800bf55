// lserve (LServe): the fraction f of KV heads that a calibration profile rates most
// streaming-like (only those scoring >= t) keep S sinks + a window of W; the others are quest
// heads with quest's parameters (their window w, W unless given).
#include "sparsity/policy_type.h"

namespace sieve::sparsity {

namespace {

const Param<LServeSpec> kLServeParams[] = {
    {"f", &LServeSpec::streaming_fraction, "the fraction of KV heads that stream", Fraction()},
    {"t", &LServeSpec::min_streaming_score, "the least calibrated streaming score that streams",
     Fraction(), Presence::kUnlessDefault},
    {"w",
     &LServeSpec::dynamic_window,
     "the quest heads' window in tokens (-1: W)",
     {.min = -1},
     Presence::kUnlessDefault},
};

class LServeType final : public TypedPolicy<LServeSpec> {
 public:
  static LayeredParams<LServeSpec, QuestSpec> params() { return {quest_params(), kLServeParams}; }
  std::string_view name() const override { return "lserve"; }
  std::string_view budget_pattern() const override {
    return "lserve:K={pages},R=4,S=4,W={recent},f=0.5,t=0.5,w={window}";
  }

 protected:
  LServeSpec parse_spec(std::span<const Item> items) const override {
    const GivenParams given(name(), items, params().keys());
    LServeSpec spec;
    params().read(given, spec.quest, spec);
    return spec;
  }
  void validate_spec(const LServeSpec& spec) const override {
    params().check(spec.quest, spec, name());
    if (spec.streaming_fraction > 0 && spec.quest.window < 1)
      fail("lserve: W must be >= 1 when f > 0 (the streaming heads' window)");
  }
  std::string print_spec(const LServeSpec& spec) const override {
    std::vector<std::string> items;
    params().print(spec.quest, spec, items);
    return policy_text(name(), items);
  }
  Json json_spec(const LServeSpec& spec) const override {
    Json object = {{"name", name()}};
    params().json(spec.quest, spec, object);
    return object;
  }
  void resolve_spec(const LServeSpec& spec, const std::vector<Cell>& cells,
                    Resolver& resolver) const override {
    std::vector<Cell> streaming =
        resolver.most_streaming(cells, spec.streaming_fraction, cells.size(), "lserve");
    std::erase_if(streaming, [&](const Cell& c) {
      return resolver.streaming_score(c) < spec.min_streaming_score;
    });
    resolver.set_all(streaming,
                     StreamingSpec{.num_sinks = spec.quest.num_sinks, .window = spec.quest.window});
    QuestSpec dynamic = spec.quest;
    if (spec.dynamic_window >= 0) dynamic.window = spec.dynamic_window;
    resolver.set_all(Resolver::without(cells, streaming), dynamic);
  }
};

}  // namespace

const PolicyType& lserve_policy_type() {
  static const LServeType type;
  return type;
}

}  // namespace sieve::sparsity
