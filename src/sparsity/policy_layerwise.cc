// layerwise: the first L layers dense, the others `rest`.
#include "sparsity/policy_type.h"

namespace sieve::sparsity {

namespace {

const Param<LayerwiseSpec> kLayerwiseParams[] = {
    {"L",
     &LayerwiseSpec::num_full_layers,
     "the number of dense first layers",
     {},
     Presence::kRequired},
};
constexpr std::string_view kKeys[] = {"L", "rest"};

class LayerwiseType final : public TypedPolicy<LayerwiseSpec> {
 public:
  std::string_view name() const override { return "layerwise"; }
  std::string_view budget_pattern() const override {
    return "layerwise:L=1,rest=snapkv:B={budget},W={window}";
  }

 protected:
  LayerwiseSpec parse_spec(std::span<const Item> items) const override {
    std::vector<Item> own;
    std::optional<std::string_view> rest;
    for (const Item& item : items) {
      if (item.key == "rest") {
        rest = item.value;
      } else {
        own.push_back(item);
      }
    }
    LayerwiseSpec spec;
    read_params<LayerwiseSpec>(kLayerwiseParams, GivenParams(name(), own, {kKeys[0], kKeys[1]}),
                               spec);
    if (!rest) fail("{}: missing rest (the policy of the other layers)", name());
    spec.rest = parse_node(strip_parens(*rest, name()));
    return spec;
  }
  void validate_spec(const LayerwiseSpec& spec) const override {
    check_params<LayerwiseSpec>(kLayerwiseParams, spec, name());
    sparsity::validate(*spec.rest);
  }
  std::string print_spec(const LayerwiseSpec& spec) const override {
    std::vector<std::string> items;
    print_params<LayerwiseSpec>(kLayerwiseParams, spec, items);
    items.push_back("rest=" + to_string(*spec.rest));
    return policy_text(name(), items);
  }
  Json json_spec(const LayerwiseSpec& spec) const override {
    Json object = {{"name", name()}, {"rest", policy_type(*spec.rest).to_json(*spec.rest)}};
    json_params<LayerwiseSpec>(kLayerwiseParams, spec, object);
    return object;
  }
  void resolve_spec(const LayerwiseSpec& spec, const std::vector<Cell>& cells,
                    Resolver& resolver) const override {
    std::vector<Cell> dense, rest;
    for (const Cell& c : cells) (c.layer < spec.num_full_layers ? dense : rest).push_back(c);
    resolver.set_all(dense, DenseHead{});
    if (!rest.empty()) resolver.assign(*spec.rest, rest);
  }
};

}  // namespace

const PolicyType& layerwise_policy_type() {
  static const LayerwiseType type;
  return type;
}

}  // namespace sieve::sparsity
