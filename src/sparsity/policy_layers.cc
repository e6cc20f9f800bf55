// layers: per layer groups, each claiming the listed layers (LIST := N or N-M, joined by '+');
// the rest get `rest` (default full).
#include "sparsity/policy_groups.h"

namespace sieve::sparsity {

namespace {

class LayersType final : public TypedPolicy<LayersSpec> {
 public:
  std::string_view name() const override { return "layers"; }

 protected:
  LayersSpec parse_spec(std::span<const Item> items) const override {
    return parse_groups<LayersSpec>(
        name(), items, [&](PolicySpec policy, std::string_view selector) {
          return LayerGroup{std::move(policy), parse_index_list(name(), "layers", selector)};
        });
  }
  void validate_spec(const LayersSpec& spec) const override {
    if (spec.groups.empty()) fail("layers: needs at least one group");
    for (const LayerGroup& group : spec.groups) {
      sparsity::validate(*group.policy);
      if (group.layers.indices.empty()) fail("layers: empty layer list");
    }
    sparsity::validate(*spec.rest);
  }
  std::string print_spec(const LayersSpec& spec) const override {
    std::vector<std::string> groups;
    for (const LayerGroup& group : spec.groups) {
      groups.push_back(
          fmt::format("({})@{}", to_string(*group.policy), index_list_string(group.layers)));
    }
    return print_groups(name(), groups, *spec.rest);
  }
  Json json_spec(const LayersSpec& spec) const override {
    Json groups = Json::array();
    for (const LayerGroup& group : spec.groups) {
      groups.push_back({{"policy", policy_type(*group.policy).to_json(*group.policy)},
                        {"layers", group.layers.indices}});
    }
    return json_groups(name(), std::move(groups), *spec.rest);
  }
  void resolve_spec(const LayersSpec& spec, const std::vector<Cell>& cells,
                    Resolver& resolver) const override {
    const CellAxis axis{.policy = "layers",
                        .index = "layer",
                        .plural = "layers",
                        .size = resolver.shape().num_layers,
                        .member = &Cell::layer};
    std::vector<bool> listed(static_cast<size_t>(axis.size), false);
    assign_groups(spec.groups, *spec.rest, cells, resolver,
                  [&](const LayerGroup& group, std::vector<Cell>& remaining) {
                    return claim_listed(remaining, group.layers, axis, listed);
                  });
  }
};

}  // namespace

const PolicyType& layers_policy_type() {
  static const LayersType type;
  return type;
}

}  // namespace sieve::sparsity
