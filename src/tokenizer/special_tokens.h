#pragma once
// Internal to src/tokenizer: cutting the input on the text of special tokens before the
// regular tokenizer sees it (llama.cpp's tokenizer_st_partition).
//
// Candidates are the CONTROL, UNKNOWN and USER_DEFINED tokens. USER_DEFINED tokens are always
// cut out (as Hugging Face's added tokens are); CONTROL and UNKNOWN only with parse_special.
// Priority: longer texts first (ties: lower id). Each candidate in turn takes its leftmost
// non-overlapping occurrences inside the stretches of text that earlier candidates left uncut,
// e.g. with "<a>" and "a>bc" in the vocabulary, "<a>bc" gives ["<", "a>bc"]: the longer one
// wins even though the shorter one starts first.
//
// Added-token flags (Vocab::added_token_flags, Hugging Face's): a single_word candidate's
// occurrence counts only where the characters on both sides of it are not letters or digits;
// once the cuts are made, an lstrip / rstrip token's cut grows over the white space to its left /
// right, up to the neighbouring cut ("a <x>  b" with rstrip <x>: ["a ", <x>, "b"]).
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace sieve::tok {

// A run of the input: raw text for the tokenizer, or a special token cut out of it.
struct Fragment {
  std::string_view text;  // empty iff token is set
  std::optional<TokenId> token;
};

class SpecialTokenMatcher {
 public:
  explicit SpecialTokenMatcher(const Vocab& vocab);

  // Fragments in input order; the texts and token texts concatenate to `text`, less the white
  // space lstrip / rstrip tokens took.
  // Cost: one trie walk per input byte, plus sorting the occurrences found.
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;

 private:
  struct Candidate {
    TokenId id = 0;
    uint32_t length = 0;  // bytes of its text, > 0
    bool always = false;  // USER_DEFINED: cut out even without parse_special
    AddedTokenFlags flags;
  };
  struct Node {
    std::vector<std::pair<uint8_t, uint32_t>> children;  // (byte, node index), sorted by byte
    std::optional<uint32_t> candidate;                   // index into candidates_ (priority order)
  };
  uint32_t child(uint32_t node, uint8_t byte) const;  // 0 (the root) when absent
  // Whether text[begin, end) stands alone: no letter or digit right before or after it.
  static bool single_word_at(std::string_view text, size_t begin, size_t end);

  std::vector<Candidate> candidates_;  // priority order
  std::vector<Node> trie_;             // trie_[0] is the root
};

}  // namespace sieve::tok
