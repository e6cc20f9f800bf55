#pragma once
// Prompt lookup (vLLM's "ngram" method): text that repeats itself — code being edited, a document
// being quoted, a list being continued — is drafted from its earlier occurrence. For n from
// max_n down to min_n, the last n tokens are searched for among the earlier tokens (prompt and
// output alike); at the latest earlier match, the tokens that followed it are the draft (up to
// max_tokens of them). No match: an empty draft, and the step is a plain decode.
//
// Cost: O(tokens * n) comparisons per n tried; at 16k tokens and n <= 4 that is well under a
// millisecond, against the tens of milliseconds of a forward step.
#include <cstdint>
#include <span>
#include <vector>

namespace sieve::speculative {

std::vector<int32_t> propose_ngram(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n,
                                   int32_t max_tokens);

}  // namespace sieve::speculative
