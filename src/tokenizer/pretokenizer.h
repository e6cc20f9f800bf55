#pragma once
// Internal to src/tokenizer: the regex pre-tokenizer of byte-level BPE vocabularies.
//
// tokenizer.ggml.pre names a family; each family is an ordered list of regexes (the lists
// llama.cpp uses). Splitting starts from one piece holding the whole text; each regex in turn
// is run over every piece and cuts it into its matches *and* the unmatched stretches between
// them (nothing is dropped), so the concatenated words always equal the (normalized) text.
//
// Matching is PCRE2 (UTF + UCP, JIT). Two details make it agree with llama.cpp's engines:
//   - \s and \S mean the Unicode White_Space set that llama.cpp's tables use (PCRE2's \s would
//     also take U+180E);
//   - each piece is its own subject, so anchors and lookarounds never see past a piece, and
//     `$` matches only at the very end of a piece (PCRE2_DOLLAR_ENDONLY).
// Letter/number/punctuation classes come from PCRE2's Unicode tables (Unicode 14 in PCRE2
// 10.42); llama.cpp generates its own from Python. Code points assigned in later Unicode
// versions can therefore be classified differently.
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sieve::tok {

// Per-family settings beyond the regexes.
struct PreTokenizerTraits {
  bool ignore_merges = false;  // a word that is itself a token is emitted without merging
  bool add_bos = false;        // default for tokenizer.ggml.add_bos_token when absent
};

// std::nullopt when name is not a family sieve knows.
std::optional<PreTokenizerTraits> find_pre_tokenizer(std::string_view name);

class PreTokenizer {
 public:
  // Compiles the family's regexes. Throws sieve::Error for an unknown name.
  explicit PreTokenizer(std::string_view name);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  const PreTokenizerTraits& traits() const { return traits_; }

  // Splits text into words (non-empty, in order). Malformed UTF-8 is first replaced by U+FFFD,
  // one per bad byte, as llama.cpp does; the words concatenate to that normalized text.
  // Thread-safe. Cost: linear in the text for every supported family.
  std::vector<std::string> split(std::string_view text) const;

 private:
  struct Regex;
  PreTokenizerTraits traits_;
  std::vector<std::unique_ptr<Regex>> regexes_;
};

}  // namespace sieve::tok
