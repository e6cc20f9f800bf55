// heads: and layers: grammar and index claims (policy_groups.h).
#include "sparsity/policy_groups.h"

namespace sieve::sparsity {

GroupsText parse_group_items(std::string_view name, std::span<const Item> items) {
  GroupsText out{.groups = {}, .rest = {FullSpec{}}};
  bool has_rest = false;
  for (const Item& item : items) {
    if (item.key == "rest") {
      out.rest = parse_node(strip_parens(item.value, name));
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
    out.groups.push_back({parse_node(policy_text), item.value.substr(at + 1)});
  }
  if (out.groups.empty()) fail("{}: needs at least one group (POLICY@SELECTOR)", name);
  return out;
}

std::string print_groups(std::string_view policy, const std::vector<std::string>& groups,
                         const PolicySpec& rest) {
  std::string out = fmt::format("{}:", policy);
  for (const std::string& group : groups) out += group + ',';
  return out + "rest=" + to_string(rest);
}

Json json_groups(std::string_view policy, Json groups, const PolicySpec& rest) {
  return {
      {"name", policy}, {"groups", std::move(groups)}, {"rest", policy_type(rest).to_json(rest)}};
}

std::vector<Cell> claim_listed(std::vector<Cell>& remaining, const IndexList& list,
                               const CellAxis& axis, std::vector<bool>& listed) {
  std::vector<Cell> claimed;
  for (int64_t index : list.indices) {
    if (index >= axis.size) {
      fail("{}: {} {} out of range (the model has {} {})", axis.policy, axis.index, index,
           axis.size, axis.plural);
    }
    if (listed[static_cast<size_t>(index)]) {
      fail("{}: {} {} is in two groups", axis.policy, axis.index, index);
    }
    listed[static_cast<size_t>(index)] = true;
    for (const Cell& c : remaining) {
      if (c.*axis.member == index) claimed.push_back(c);
    }
  }
  remaining = Resolver::without(remaining, claimed);
  return claimed;
}

}  // namespace sieve::sparsity
