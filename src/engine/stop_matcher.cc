#include "engine/stop_matcher.h"

#include <algorithm>
#include <cassert>
#include <utility>

namespace sieve::engine {

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
  }
  return "stop";
}

StopMatcher::StopMatcher(const SamplingParams& params, std::span<const TokenId> eos_token_ids)
    : stop_token_ids_(all_stop_token_ids(params, eos_token_ids)),
      min_tokens_(params.min_tokens),
      max_tokens_(params.max_tokens),
      include_stop_(params.include_stop_str_in_output) {
  if (!params.ignore_eos) {
    eos_token_ids_.assign(eos_token_ids.begin(), eos_token_ids.end());
    std::sort(eos_token_ids_.begin(), eos_token_ids_.end());
  }
  for (const std::string& stop : params.stop_strings) {
    assert(!stop.empty() && "check_sampling_params rejects empty stop strings");
    if (!stop.empty()) stop_strings_.push_back(stop);
  }
}

// The stop string that completes first in held_, among those ending after its first
// `num_old_bytes` bytes (earlier ends were checked, or did not count yet, on earlier pushes).
std::optional<StopMatcher::Match> StopMatcher::find_match(size_t num_old_bytes) const {
  std::optional<Match> best;
  for (size_t i = 0; i < stop_strings_.size(); ++i) {
    const std::string& stop = stop_strings_[i];
    // The first occurrence ending at or after num_old_bytes + 1 starts at or after this.
    const size_t from = num_old_bytes + 1 > stop.size() ? num_old_bytes + 1 - stop.size() : 0;
    const size_t begin = held_.find(stop, from);
    if (begin == std::string::npos) continue;
    const Match match{begin, begin + stop.size(), i};
    if (!best || match.end < best->end || (match.end == best->end && match.begin < best->begin)) {
      best = match;
    }
  }
  return best;
}

// Length of the longest prefix of held_ that no stop string can start in: everything before
// the first suffix of held_ that is a proper prefix of a stop string.
size_t StopMatcher::num_safe_bytes() const {
  size_t safe = held_.size();
  for (const std::string& stop : stop_strings_) {
    const size_t longest = std::min(held_.size(), stop.size() - 1);
    for (size_t len = longest; len > 0; --len) {
      if (held_.size() - len >= safe) break;  // an earlier-starting suffix was found already
      if (std::string_view(held_).substr(held_.size() - len) ==
          std::string_view(stop).substr(0, len)) {
        safe = held_.size() - len;
        break;
      }
    }
  }
  return safe;
}

StopUpdate StopMatcher::finish_with(std::string text, Finish finish) {
  finished_ = true;
  held_.clear();
  return {std::move(text), std::move(finish)};
}

StopUpdate StopMatcher::push(TokenId token, std::string_view piece) {
  assert(!finished_);
  ++num_tokens_;
  const bool stops_count = num_tokens_ >= min_tokens_;

  if (stops_count && std::binary_search(stop_token_ids_.begin(), stop_token_ids_.end(), token)) {
    std::string text = std::exchange(held_, {});
    if (include_stop_) text += utf8_.push(piece);
    text += utf8_.flush();
    Finish finish{FinishReason::kStop, {}};
    if (!std::binary_search(eos_token_ids_.begin(), eos_token_ids_.end(), token)) {
      finish.matched = token;  // as vLLM: EOS reports no stop reason
    }
    return finish_with(std::move(text), std::move(finish));
  }

  const size_t num_old_bytes = held_.size();
  held_ += utf8_.push(piece);
  if (stops_count) {
    if (const std::optional<Match> match = find_match(num_old_bytes)) {
      std::string text = held_.substr(0, include_stop_ ? match->end : match->begin);
      return finish_with(std::move(text), {FinishReason::kStop, stop_strings_[match->stop_idx]});
    }
  }
  if (max_tokens_ && num_tokens_ >= *max_tokens_) return finish(FinishReason::kLength);

  const size_t safe = include_stop_ ? held_.size() : num_safe_bytes();
  StopUpdate update{held_.substr(0, safe), std::nullopt};
  held_.erase(0, safe);
  return update;
}

StopUpdate StopMatcher::finish(FinishReason reason) {
  assert(!finished_);
  std::string text = std::exchange(held_, {});
  text += utf8_.flush();
  return finish_with(std::move(text), {reason, {}});
}

}  // namespace sieve::engine
