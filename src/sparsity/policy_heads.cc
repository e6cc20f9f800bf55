// heads: per KV head groups. A group takes the fraction of heads a calibration profile rates
// most streaming-like (profile=F) or the listed KV head indices of every layer (kv=LIST);
// groups claim heads in order; the rest get `rest` (default full).
#include "sparsity/policy_groups.h"

namespace sieve::sparsity {

namespace {

class HeadsType final : public TypedPolicy<HeadsSpec> {
 public:
  std::string_view name() const override { return "heads"; }

 protected:
  HeadsSpec parse_spec(std::span<const Item> items) const override {
    return parse_groups<HeadsSpec>(
        name(), items, [&](PolicySpec policy, std::string_view selector) {
          HeadGroup group{std::move(policy), ProfileFraction{}};
          if (selector.starts_with("profile=")) {
            group.selector = ProfileFraction{parse_double(name(), "profile", selector.substr(8))};
          } else if (selector.starts_with("kv=")) {
            group.selector = parse_index_list(name(), "kv", selector.substr(3));
          } else {
            fail("{}: selector must be profile=FRACTION or kv=LIST, got \"{}\"", name(), selector);
          }
          return group;
        });
  }
  void validate_spec(const HeadsSpec& spec) const override {
    if (spec.groups.empty()) fail("heads: needs at least one group");
    for (const HeadGroup& group : spec.groups) {
      sparsity::validate(*group.policy);
      if (const auto* fraction = std::get_if<ProfileFraction>(&group.selector)) {
        check_range(name(), "profile", fraction->fraction, Fraction());
      } else if (std::get<IndexList>(group.selector).indices.empty()) {
        fail("heads: empty kv list");
      }
    }
    sparsity::validate(*spec.rest);
  }
  std::string print_spec(const HeadsSpec& spec) const override {
    std::vector<std::string> groups;
    for (const HeadGroup& group : spec.groups) {
      const auto* fraction = std::get_if<ProfileFraction>(&group.selector);
      groups.push_back(
          fmt::format("({})@{}", to_string(*group.policy),
                      fraction ? "profile=" + number_text(fraction->fraction)
                               : "kv=" + index_list_string(std::get<IndexList>(group.selector))));
    }
    return print_groups(name(), groups, *spec.rest);
  }
  Json json_spec(const HeadsSpec& spec) const override {
    Json groups = Json::array();
    for (const HeadGroup& group : spec.groups) {
      Json g = {{"policy", policy_type(*group.policy).to_json(*group.policy)}};
      if (const auto* fraction = std::get_if<ProfileFraction>(&group.selector)) {
        g["profile"] = fraction->fraction;
      } else {
        g["kv"] = std::get<IndexList>(group.selector).indices;
      }
      groups.push_back(std::move(g));
    }
    return json_groups(name(), std::move(groups), *spec.rest);
  }
  void resolve_spec(const HeadsSpec& spec, const std::vector<Cell>& cells,
                    Resolver& resolver) const override {
    const CellAxis axis{.policy = "heads",
                        .index = "kv head",
                        .plural = "KV heads",
                        .size = resolver.shape().num_kv_heads,
                        .member = &Cell::kv_head};
    std::vector<bool> listed(static_cast<size_t>(axis.size), false);
    assign_groups(
        spec.groups, *spec.rest, cells, resolver,
        [&](const HeadGroup& group, std::vector<Cell>& remaining) {
          const auto* fraction = std::get_if<ProfileFraction>(&group.selector);
          if (!fraction) {
            return claim_listed(remaining, std::get<IndexList>(group.selector), axis, listed);
          }
          std::vector<Cell> claimed =
              resolver.most_streaming(remaining, fraction->fraction, cells.size(), "heads:profile");
          remaining = Resolver::without(remaining, claimed);
          return claimed;
        });
  }
};

}  // namespace

const PolicyType& heads_policy_type() {
  static const HeadsType type;
  return type;
}

}  // namespace sieve::sparsity
