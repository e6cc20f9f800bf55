#pragma once
// When does a sequence finish, and which of its text may be streamed now?
//
//   token + its piece ──► Utf8Stream (whole characters only) ──► stop-string scan ──► text to emit
//        │                                                             │
//        └─ stop token id? ──► finish "stop"                           └─ match? finish "stop"
//   after max_tokens tokens without a stop ──► finish "length"
//
// Stop strings are matched on the text, across token boundaries. Text that could still be the
// start of a stop string is held back until it cannot be (or until the sequence finishes):
//
//   stop "lo w":  push "Hel"    -> emit "He"   (holds "l": it may start "lo w")
//                 push "lo wor" -> emit "l", finish "stop" ("lo w")    whole output: "Hel"
//
// Semantics (OpenAI/vLLM):
//  - Stop strings and stop ids only count from the min_tokens-th token on (a stop string must
//    end in the text of such a token).
//  - The first stop string to complete wins (as if text arrived one byte at a time); when two
//    complete on the same byte, the one that starts first. min_tokens aside, the result does not
//    depend on how the text is split into tokens.
//  - The emitted text excludes the stop string and anything after it, or with
//    include_stop_str_in_output ends right after it (and nothing is held back).
//  - A stop token's own piece is not emitted unless include_stop_str_in_output. EOS counts as a
//    stop token unless ignore_eos.
//  - A stop on the max_tokens-th token is "stop", not "length".
// Cost per push: O((|piece| + L) * S) for S stop strings of total length L.
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/sampler.h"
#include "engine/text_stream.h"

namespace sieve::engine {

enum class FinishReason { kStop, kLength };
// OpenAI's finish_reason: "stop" or "length".
std::string_view finish_reason_name(FinishReason reason);

struct Finish {
  FinishReason reason = FinishReason::kStop;
  // vLLM's stop_reason: the stop token id or stop string that matched; empty for EOS and for
  // kLength.
  std::variant<std::monostate, TokenId, std::string> matched;
};

struct StopUpdate {
  // Safe to emit now: whole UTF-8 characters, none of which can belong to a stop string.
  std::string text;
  // Set on the call that finishes the sequence; `text` then carries everything left to emit.
  std::optional<Finish> finish;
};

class StopMatcher {
 public:
  // `eos_token_ids`: the model's end-of-generation ids.
  StopMatcher(const SamplingParams& params, std::span<const TokenId> eos_token_ids);

  // One generated token and its detokenized bytes (which may end inside a UTF-8 character).
  // Must not be called once finished().
  StopUpdate push(TokenId token, std::string_view piece);
  // Finishes for a reason found outside (e.g. the context is full: kLength) and flushes all
  // held-back text. Must not be called once finished().
  StopUpdate finish(FinishReason reason);

  bool finished() const { return finished_; }
  int32_t num_tokens() const { return num_tokens_; }

 private:
  struct Match {
    size_t begin;
    size_t end;
    size_t stop_idx;
  };
  std::optional<Match> find_match(size_t num_old_bytes) const;
  size_t num_safe_bytes() const;
  StopUpdate finish_with(std::string text, Finish finish);

  std::vector<TokenId> stop_token_ids_;  // sorted
  std::vector<TokenId> eos_token_ids_;   // sorted; empty when ignore_eos
  std::vector<std::string> stop_strings_;
  int32_t min_tokens_ = 0;
  std::optional<int32_t> max_tokens_;
  bool include_stop_ = false;

  Utf8Stream utf8_;
  std::string held_;  // whole characters not yet emitted; a proper prefix of some stop string
  int32_t num_tokens_ = 0;
  bool finished_ = false;
};

}  // namespace sieve::engine
