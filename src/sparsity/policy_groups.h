#pragma once
// Internal to src/sparsity: what the per-KV-head and per-layer compositions (heads:, layers:)
// share: the GROUP@SELECTOR,...,rest=POLICY grammar, and claiming cells by listed indices.
#include <string>
#include <string_view>
#include <vector>

#include "sparsity/policy_type.h"

namespace sieve::sparsity {

struct GroupText {
  PolicySpec policy;
  std::string_view selector;  // after '@'
};
struct GroupsText {
  std::vector<GroupText> groups;  // at least one
  PolicySpec rest;                // full unless given
};
GroupsText parse_group_items(std::string_view policy, std::span<const Item> items);

// A heads: or layers: spec from its items; make_group(policy, selector) makes one group.
template <typename Spec, typename MakeGroup>
Spec parse_groups(std::string_view policy, std::span<const Item> items, MakeGroup&& make_group) {
  GroupsText text = parse_group_items(policy, items);
  Spec spec;
  for (GroupText& group : text.groups) {
    spec.groups.push_back(make_group(std::move(group.policy), group.selector));
  }
  spec.rest = std::move(text.rest);
  return spec;
}
// "NAME:(POLICY)@SELECTOR,...,rest=REST" from each group's "(POLICY)@SELECTOR".
std::string print_groups(std::string_view policy, const std::vector<std::string>& groups,
                         const PolicySpec& rest);
Json json_groups(std::string_view policy, Json groups, const PolicySpec& rest);

// Groups claim cells in order (claim(group, remaining) takes its cells out of remaining, which
// is `cells` at first) and get their policy; the cells left get `rest`.
template <typename Group, typename Claim>
void assign_groups(const std::vector<Group>& groups, const PolicySpec& rest,
                   const std::vector<Cell>& cells, Resolver& resolver, Claim&& claim) {
  std::vector<Cell> remaining = cells;
  for (const Group& group : groups) {
    const std::vector<Cell> claimed = claim(group, remaining);
    if (!claimed.empty()) resolver.assign(*group.policy, claimed);
  }
  if (!remaining.empty()) resolver.assign(rest, remaining);
}

// The cells of one index along an axis of the model: KV heads or layers.
struct CellAxis {
  std::string_view policy;  // for errors: "heads"
  std::string_view index;   // "kv head"
  std::string_view plural;  // "KV heads"
  int64_t size = 0;         // of the model
  int64_t Cell::*member = nullptr;
};
// Moves out of `remaining` the cells whose index is in `list`; `listed` ([axis.size]) records
// the indices claimed so far, none twice. Throws for an index out of range or listed twice.
std::vector<Cell> claim_listed(std::vector<Cell>& remaining, const IndexList& list,
                               const CellAxis& axis, std::vector<bool>& listed);

}  // namespace sieve::sparsity
