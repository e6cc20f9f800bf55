#include "tokenizer/special_tokens.h"

#include <algorithm>
#include <iterator>
#include <map>

#include "tokenizer/unicode.h"

namespace sieve::tok {

SpecialTokenMatcher::SpecialTokenMatcher(const Vocab& vocab) {
  for (size_t id = 0; id < vocab.size(); ++id) {
    const TokenType type = vocab.types[id];
    const bool special = type == TokenType::kControl || type == TokenType::kUnknown;
    const bool user_defined = type == TokenType::kUserDefined;
    if ((!special && !user_defined) || vocab.tokens[id].empty()) continue;
    candidates_.push_back(
        {static_cast<TokenId>(id), static_cast<uint32_t>(vocab.tokens[id].size()), user_defined,
         vocab.added_token_flags.empty() ? AddedTokenFlags{} : vocab.added_token_flags[id]});
  }
  std::stable_sort(candidates_.begin(), candidates_.end(),
                   [](const Candidate& a, const Candidate& b) { return a.length > b.length; });

  trie_.emplace_back();
  for (uint32_t index = 0; index < candidates_.size(); ++index) {
    uint32_t node = 0;
    for (char c : vocab.tokens[candidates_[index].id]) {
      const auto byte = static_cast<uint8_t>(c);
      uint32_t next = child(node, byte);
      if (next == 0) {
        next = static_cast<uint32_t>(trie_.size());
        trie_.emplace_back();
        auto& children = trie_[node].children;
        children.insert(
            std::lower_bound(children.begin(), children.end(), std::make_pair(byte, uint32_t{0})),
            {byte, next});
      }
      node = next;
    }
    trie_[node].candidate = index;  // token texts are unique, so each node ends at most one
  }
}

uint32_t SpecialTokenMatcher::child(uint32_t node, uint8_t byte) const {
  const auto& children = trie_[node].children;
  auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, uint32_t{0}));
  return it != children.end() && it->first == byte ? it->second : 0;
}

bool SpecialTokenMatcher::single_word_at(std::string_view text, size_t begin, size_t end) {
  return (begin == 0 || !unicode::is_alphanumeric(unicode::code_point_before(text, begin))) &&
         (end == text.size() || !unicode::is_alphanumeric(unicode::code_point_at(text, end)));
}

std::vector<Fragment> SpecialTokenMatcher::partition(std::string_view text,
                                                     bool parse_special) const {
  // 1. Every occurrence of every enabled candidate, as (priority, start).
  struct Occurrence {
    uint32_t candidate;
    size_t begin;
  };
  std::vector<Occurrence> occurrences;
  if (!candidates_.empty()) {
    for (size_t begin = 0; begin < text.size(); ++begin) {
      uint32_t node = 0;
      for (size_t i = begin; i < text.size(); ++i) {
        node = child(node, static_cast<uint8_t>(text[i]));
        if (node == 0) break;
        const auto& candidate = trie_[node].candidate;
        if (candidate && (parse_special || candidates_[*candidate].always) &&
            (!candidates_[*candidate].flags.single_word || single_word_at(text, begin, i + 1))) {
          occurrences.push_back({*candidate, begin});
        }
      }
    }
  }
  if (occurrences.empty()) {
    if (text.empty()) return {};
    return {Fragment{text, std::nullopt}};
  }
  std::sort(occurrences.begin(), occurrences.end(), [](const Occurrence& a, const Occurrence& b) {
    return a.candidate != b.candidate ? a.candidate < b.candidate : a.begin < b.begin;
  });

  // 2. In priority order, accept an occurrence when it neither overlaps a cut made by an
  //    earlier candidate nor the previous accepted occurrence of the same candidate.
  std::map<size_t, std::pair<size_t, uint32_t>> cuts;  // begin -> (end, candidate)
  size_t same_candidate_end = 0;
  std::optional<uint32_t> last_candidate;
  for (const Occurrence& occurrence : occurrences) {
    if (occurrence.candidate != last_candidate) {
      last_candidate = occurrence.candidate;
      same_candidate_end = 0;
    }
    const size_t begin = occurrence.begin;
    const size_t end = begin + candidates_[occurrence.candidate].length;
    if (begin < same_candidate_end) continue;
    auto next = cuts.lower_bound(begin);
    if (next != cuts.end() && next->first < end) continue;
    if (next != cuts.begin() && std::prev(next)->second.first > begin) continue;
    cuts.emplace(begin, std::make_pair(end, occurrence.candidate));
    same_candidate_end = end;
  }

  // 3. Interleave the uncut text with the cut tokens, which take the white space their
  //    lstrip / rstrip flags say up to the previous (grown) cut and the next cut.
  std::vector<Fragment> fragments;
  size_t position = 0;
  for (auto it = cuts.begin(); it != cuts.end(); ++it) {
    const auto& [end, candidate_index] = it->second;
    const Candidate& candidate = candidates_[candidate_index];
    size_t begin = it->first;
    if (candidate.flags.lstrip)
      begin = std::max(position, unicode::white_space_start_before(text, begin));
    if (begin > position) fragments.push_back({text.substr(position, begin - position), {}});
    fragments.push_back({{}, candidate.id});
    position = end;
    if (candidate.flags.rstrip) {
      const size_t next_cut = std::next(it) == cuts.end() ? text.size() : std::next(it)->first;
      position = std::min(next_cut, unicode::white_space_end_after(text, end));
    }
  }
  if (position < text.size()) fragments.push_back({text.substr(position), {}});
  return fragments;
}

}  // namespace sieve::tok
