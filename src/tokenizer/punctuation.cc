// find_punctuation(): which token pieces are punctuation, by PCRE2's Unicode tables.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#include <string_view>

#include "tokenizer/tokenizer_impl.h"
#include "util/error.h"

namespace sieve::tok {

std::vector<bool> find_punctuation(const std::vector<std::string>& pieces) {
  // At least one punctuation character (\p{P}), nothing but punctuation and white space.
  constexpr std::string_view kPattern = R"(\A[\s\p{P}]*\p{P}[\s\p{P}]*\z)";
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)> code(
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern.data()), kPattern.size(),
                    PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr),
      &pcre2_code_free);
  if (!code) fail("internal error: cannot compile the punctuation pattern ({})", error_code);
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create(1, nullptr), &pcre2_match_data_free);
  std::vector<bool> punctuation(pieces.size(), false);
  for (size_t id = 0; id < pieces.size(); ++id) {
    const std::string& piece = pieces[id];
    if (piece.empty()) continue;
    // Invalid UTF-8 (a lone byte token) fails the UTF check: not punctuation.
    const int rc = pcre2_match(code.get(), reinterpret_cast<PCRE2_SPTR>(piece.data()), piece.size(),
                               0, 0, match.get(), nullptr);
    punctuation[id] = rc > 0;
  }
  return punctuation;
}

}  // namespace sieve::tok
