#include "engine/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <limits>

#include <spdlog/spdlog.h>

#include "util/error.h"

namespace sieve::engine {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Descending by logit, ties to the lowest id: the order of greedy, top-k and top logprobs.
struct Ranked {
  float logit;
  TokenId id;
};
bool ranks_higher(const Ranked& a, const Ranked& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// The `count` highest-ranked logits, best first. A heap of `count` whose front is the worst
// kept so far: O(V log count), O(count) memory.
std::vector<Ranked> top_ranked(std::span<const float> logits, size_t count) {
  count = std::min(count, logits.size());
  std::vector<Ranked> heap;
  if (count == 0) return heap;
  heap.reserve(count);
  for (size_t i = 0; i < logits.size(); ++i) {
    const Ranked r{logits[i], static_cast<TokenId>(i)};
    if (heap.size() < count) {
      heap.push_back(r);
      std::push_heap(heap.begin(), heap.end(), ranks_higher);
    } else if (ranks_higher(r, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), ranks_higher);
      heap.back() = r;
      std::push_heap(heap.begin(), heap.end(), ranks_higher);
    }
  }
  std::sort(heap.begin(), heap.end(), ranks_higher);
  return heap;
}

// log(sum(exp(logits))), in double.
double log_sum_exp(std::span<const float> logits) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max_logit);
  return max_logit + std::log(sum);
}

std::vector<TokenLogprob> to_logprobs(const std::vector<Ranked>& ranked, double log_sum) {
  std::vector<TokenLogprob> out(ranked.size());
  for (size_t i = 0; i < ranked.size(); ++i) {
    out[i] = {ranked[i].id, static_cast<float>(ranked[i].logit - log_sum)};
  }
  return out;
}

// Descending weight, ties to the lowest id (weights are monotone in the logits).
bool weighs_more(const std::pair<double, TokenId>& a, const std::pair<double, TokenId>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// A uniform double in [0, 1) from the top 53 bits of one 64-bit draw: the same on every
// standard library (std::uniform_real_distribution is not).
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

bool in_range(TokenId id, int32_t vocab_size) { return id >= 0 && id < vocab_size; }

}  // namespace

std::optional<AdmissionError> check_sampling_params(const SamplingParams& p, int32_t vocab_size) {
  if (!(p.temperature >= 0.0f && p.temperature <= kMaxTemperature)) {
    return AdmissionError::invalid(
        "temperature", fmt::format("temperature must be in [0, {}] (0 is greedy), got {}",
                                   kMaxTemperature, p.temperature));
  }
  if (p.top_k < 0) {
    return AdmissionError::invalid(
        "top_k", fmt::format("top_k must be >= 0 (0 keeps all tokens), got {}", p.top_k));
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return AdmissionError::invalid(
        "top_p", fmt::format("top_p must be in (0, 1] (1 keeps all tokens), got {}", p.top_p));
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return AdmissionError::invalid(
        "min_p", fmt::format("min_p must be in [0, 1] (0 keeps all tokens), got {}", p.min_p));
  }
  if (!(p.repetition_penalty > 0.0f && p.repetition_penalty <= kMaxRepetitionPenalty)) {
    return AdmissionError::invalid(
        "repetition_penalty",
        fmt::format("repetition_penalty must be in (0, {}] (1 is none), got {}",
                    kMaxRepetitionPenalty, p.repetition_penalty));
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return AdmissionError::invalid(
        "presence_penalty",
        fmt::format("presence_penalty must be in [-2, 2], got {}", p.presence_penalty));
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return AdmissionError::invalid(
        "frequency_penalty",
        fmt::format("frequency_penalty must be in [-2, 2], got {}", p.frequency_penalty));
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (!in_range(id, vocab_size)) {
      return AdmissionError::invalid(
          "logit_bias", fmt::format("logit_bias has token id {}, but the vocabulary has ids 0..{}",
                                    id, vocab_size - 1));
    }
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return AdmissionError::invalid(
          "logit_bias",
          fmt::format("logit_bias for token {} must be in [-100, 100], got {}", id, bias));
    }
  }
  if (p.min_tokens < 0) {
    return AdmissionError::invalid("min_tokens",
                                   fmt::format("min_tokens must be >= 0, got {}", p.min_tokens));
  }
  if (p.max_tokens) {
    if (*p.max_tokens < 0) {
      return AdmissionError::invalid("max_tokens",
                                     fmt::format("max_tokens must be >= 0, got {}", *p.max_tokens));
    }
    if (p.min_tokens > *p.max_tokens) {
      return AdmissionError::invalid(
          "min_tokens", fmt::format("min_tokens ({}) must not exceed max_tokens ({})", p.min_tokens,
                                    *p.max_tokens));
    }
  }
  for (TokenId id : p.stop_token_ids) {
    if (!in_range(id, vocab_size)) {
      return AdmissionError::invalid(
          "stop_token_ids",
          fmt::format("stop_token_ids has token id {}, but the vocabulary has ids 0..{}", id,
                      vocab_size - 1));
    }
  }
  for (const std::string& stop : p.stop_strings) {
    if (stop.empty()) return AdmissionError::invalid("stop", "stop strings must not be empty");
  }
  for (TokenId t : p.forced_tokens) {
    if (t < 0 || t >= vocab_size) {
      return AdmissionError::invalid("forced_tokens",
                                     fmt::format("forced token {} is outside the vocabulary", t));
    }
  }
  if (p.logprobs && (*p.logprobs < 0 || *p.logprobs > kMaxTopLogprobs)) {
    return AdmissionError::invalid("logprobs", fmt::format("logprobs must be in [0, {}], got {}",
                                                           kMaxTopLogprobs, *p.logprobs));
  }
  if (p.n < 1) return AdmissionError::invalid("n", fmt::format("n must be >= 1, got {}", p.n));
  return std::nullopt;
}

SamplingParams params_for_sample(const SamplingParams& request, int32_t sample_idx) {
  assert(sample_idx >= 0 && sample_idx < request.n);
  SamplingParams params = request;
  params.seed = request.seed + static_cast<uint64_t>(sample_idx);
  params.n = 1;
  return params;
}

std::vector<TokenId> all_stop_token_ids(const SamplingParams& params,
                                        std::span<const TokenId> eos_token_ids) {
  std::vector<TokenId> ids = params.stop_token_ids;
  if (!params.ignore_eos) ids.insert(ids.end(), eos_token_ids.begin(), eos_token_ids.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

TokenId argmax(std::span<const float> logits) {
  return static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

double token_logprob(std::span<const float> logits, TokenId token) {
  return static_cast<double>(logits[token]) - log_sum_exp(logits);
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int count) {
  if (logits.empty() || count <= 0) return {};
  return to_logprobs(top_ranked(logits, static_cast<size_t>(count)), log_sum_exp(logits));
}

Sampler::Sampler(SamplingParams params, std::span<const TokenId> eos_token_ids)
    : params_(std::move(params)), rng_(params_.seed) {
  if (params_.min_tokens > 0) min_tokens_mask_ids_ = all_stop_token_ids(params_, eos_token_ids);
  if (params_.constraint) grammar_state_.emplace(params_.constraint->new_state());
}

void Sampler::update_grammar(std::span<const TokenId> output) {
  const grammar::TokenMasker& masker = *params_.constraint;
  if (output.size() < grammar_output_seen_) {
    // Not the sequence we have been following (or rolled back): replay from the start.
    grammar_state_.emplace(masker.new_state());
    grammar_output_seen_ = 0;
  }
  for (; grammar_output_seen_ < output.size(); ++grammar_output_seen_) {
    if (!grammar_state_) continue;  // the grammar has given up: nothing to follow
    const TokenId id = output[grammar_output_seen_];
    bool accepted = false;
    try {
      accepted = masker.accept_token(*grammar_state_, id);
    } catch (const Error& e) {
      spdlog::warn("constrained decoding stops: {}", e.what());
    }
    if (!accepted) grammar_state_.reset();
  }
}

std::span<const float> Sampler::apply_constraint(std::span<const float> logits) {
  fill_constraint_mask();
  // One pass, word by word: masks are mostly long runs of all-allowed or all-refused tokens.
  // Logits beyond the tokenizer's vocabulary (padded output rows) are never allowed.
  masked_.resize(logits.size());
  const std::span<const uint64_t> words = mask_.words();
  for (size_t begin = 0, w = 0; begin < logits.size(); begin += 64, ++w) {
    const size_t end = std::min(logits.size(), begin + 64);
    const uint64_t bits = w < words.size() ? words[w] : 0;
    if (bits == 0) {
      std::fill(masked_.begin() + begin, masked_.begin() + end, kNegInf);
    } else if (bits == ~uint64_t{0}) {
      std::copy(logits.begin() + begin, logits.begin() + end, masked_.begin() + begin);
    } else {
      for (size_t i = begin; i < end; ++i)
        masked_[i] = (bits >> (i - begin)) & 1 ? logits[i] : kNegInf;
    }
  }
  return masked_;
}

TokenId Sampler::constrained_argmax(std::span<const float> logits) {
  fill_constraint_mask();
  const std::span<const uint64_t> words = mask_.words();
  TokenId best = -1;
  float best_logit = kNegInf;
  for (size_t w = 0; w < words.size() && w * 64 < logits.size(); ++w) {
    for (uint64_t bits = words[w]; bits != 0; bits &= bits - 1) {
      const size_t i = w * 64 + static_cast<size_t>(std::countr_zero(bits));
      if (i >= logits.size()) break;
      if (best < 0 || logits[i] > best_logit) {  // ascending ids: ties go to the lowest
        best = static_cast<TokenId>(i);
        best_logit = logits[i];
      }
    }
  }
  return best;
}

void Sampler::fill_constraint_mask() {
  const grammar::TokenMasker& masker = *params_.constraint;
  const grammar::Vocabulary& vocabulary = masker.vocabulary();
  size_t num_allowed = 0;
  if (grammar_state_) {
    try {
      num_allowed = masker.fill_mask(*grammar_state_, mask_);
    } catch (const Error& e) {
      spdlog::warn("constrained decoding stops: {}", e.what());
      grammar_state_.reset();
    }
  }
  if (num_allowed == 0) {
    // Nothing the grammar allows (it gave up, or this vocabulary cannot continue it): end.
    mask_.reset(vocabulary.size());
    for (TokenId id : vocabulary.eog_ids()) mask_.set(static_cast<size_t>(id));
  }
}

void Sampler::update_history(const SequenceTokens& history) {
  const bool track_output = params_.repetition_penalty != 1.0f ||
                            params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  const bool track_prompt = params_.repetition_penalty != 1.0f;
  if (!track_output) return;
  if (history.prompt.size() < num_prompt_seen_ || history.output.size() < num_output_seen_) {
    // Not the sequence we have been following (or rolled back): recount from scratch.
    num_prompt_seen_ = num_output_seen_ = 0;
    prompt_ids_.clear();
    output_counts_.clear();
  }
  if (track_prompt && history.prompt.size() > num_prompt_seen_) {
    prompt_ids_.insert(prompt_ids_.end(), history.prompt.begin() + num_prompt_seen_,
                       history.prompt.end());
    std::sort(prompt_ids_.begin(), prompt_ids_.end());
    prompt_ids_.erase(std::unique(prompt_ids_.begin(), prompt_ids_.end()), prompt_ids_.end());
    num_prompt_seen_ = history.prompt.size();
  }
  for (size_t i = num_output_seen_; i < history.output.size(); ++i)
    ++output_counts_[history.output[i]];
  num_output_seen_ = history.output.size();
}

bool Sampler::needs_scratch(int64_t num_output) const {
  return !params_.logit_bias.empty() ||
         (num_output < params_.min_tokens && !min_tokens_mask_ids_.empty()) ||
         (params_.repetition_penalty != 1.0f &&
          (!prompt_ids_.empty() || !output_counts_.empty())) ||
         ((params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) &&
          !output_counts_.empty());
}

void Sampler::apply_bias_and_penalties(std::span<float> logits, int64_t num_output) const {
  const auto vocab_size = static_cast<TokenId>(logits.size());
  // 1. logit_bias, then the min_tokens mask (so no bias can undo it).
  for (const auto& [id, bias] : params_.logit_bias) {
    assert(in_range(id, vocab_size));
    logits[id] += bias;
  }
  if (num_output < params_.min_tokens) {
    for (TokenId id : min_tokens_mask_ids_) {
      if (in_range(id, vocab_size)) logits[id] = kNegInf;
    }
  }
  // 2. Repetition penalty over prompt ∪ output (each distinct token once), then frequency and
  // presence over the output.
  if (const float penalty = params_.repetition_penalty; penalty != 1.0f) {
    auto penalise = [&](TokenId id) {
      assert(in_range(id, vocab_size));
      float& l = logits[id];
      l = l > 0.0f ? l / penalty : l * penalty;
    };
    for (TokenId id : prompt_ids_) penalise(id);
    for (const auto& [id, count] : output_counts_) {
      if (!std::binary_search(prompt_ids_.begin(), prompt_ids_.end(), id)) penalise(id);
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (const auto& [id, count] : output_counts_) {
      assert(in_range(id, vocab_size));
      logits[id] -=
          params_.frequency_penalty * static_cast<float>(count) + params_.presence_penalty;
    }
  }
}

TokenId Sampler::sample_truncated(std::span<const float> logits) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  if (!(max_logit > kNegInf)) return argmax(logits);  // every token masked: nothing to draw from

  // 4. Temperature and unnormalised softmax; the best token has weight exactly 1.
  const double inv_temperature = 1.0 / params_.temperature;
  candidates_.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] == kNegInf) continue;  // masked (constraint, min_tokens, bias): weight 0
    const double weight = std::exp((static_cast<double>(logits[i]) - max_logit) * inv_temperature);
    if (weight > 0.0) candidates_.emplace_back(weight, static_cast<TokenId>(i));
  }
  // 5. Top-k: the k heaviest, unordered.
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < candidates_.size()) {
    std::nth_element(candidates_.begin(), candidates_.begin() + params_.top_k, candidates_.end(),
                     weighs_more);
    candidates_.resize(params_.top_k);
  }
  double top_k_mass = 0.0;
  for (const auto& c : candidates_) top_k_mass += c.first;
  // 7. Min-p before 6. top-p gives the same set as the documented order: min-p compares with
  // p_max only, so it cuts a most-likely prefix whatever the normalisation, and top-p below
  // still normalises by the top-k mass. The set kept is the shorter of the two prefixes.
  if (params_.min_p > 0.0f) {
    const double threshold = params_.min_p;  // * p_max, which is weight 1
    std::erase_if(candidates_, [&](const auto& c) { return c.first < threshold; });
  }
  // 6. Top-p: sort only as far as needed, in growing chunks (nth_element, then sort the chunk).
  if (params_.top_p < 1.0f) {
    const double target = static_cast<double>(params_.top_p) * top_k_mass;
    const size_t num_candidates = candidates_.size();
    size_t num_sorted = 0, chunk = 64;
    std::optional<size_t> keep;
    double mass = 0.0;
    while (!keep && num_sorted < num_candidates) {
      const auto first = candidates_.begin() + num_sorted;
      const size_t end = std::min(num_candidates, num_sorted + chunk);
      if (end < num_candidates) {
        std::nth_element(first, candidates_.begin() + end, candidates_.end(), weighs_more);
      }
      std::sort(first, candidates_.begin() + end, weighs_more);
      for (; num_sorted < end && !keep; ++num_sorted) {
        mass += candidates_[num_sorted].first;
        if (mass >= target) keep = num_sorted + 1;
      }
      chunk *= 4;
    }
    if (keep) candidates_.resize(*keep);
  }
  // 8. One draw by inverse CDF over what is left.
  double kept_mass = 0.0;
  for (const auto& c : candidates_) kept_mass += c.first;
  double r = uniform01(rng_) * kept_mass;
  for (const auto& c : candidates_) {
    r -= c.first;
    if (r < 0.0) return c.second;
  }
  return candidates_.back().second;
}

SampleResult Sampler::sample(std::span<const float> logits, const SequenceTokens& history) {
  assert(!logits.empty());
  update_history(history);
  const auto num_output = static_cast<int64_t>(history.output.size());
  if (params_.constraint) {
    update_grammar(history.output);
    // Greedy with nothing else to apply: the argmax over the allowed tokens, no masked copy.
    if (params_.temperature < kGreedyTemperature && !params_.logprobs &&
        !needs_scratch(num_output) &&
        num_output >= static_cast<int64_t>(params_.forced_tokens.size())) {
      if (const TokenId best = constrained_argmax(logits); best >= 0) return {.token = best};
    }
    logits = apply_constraint(logits);
  }
  std::span<const float> processed = logits;
  if (needs_scratch(num_output)) {
    logits_.assign(logits.begin(), logits.end());
    apply_bias_and_penalties(logits_, num_output);
    processed = logits_;
    // The grammar wins over min_tokens: if it allows only the masked stop tokens, keep them.
    if (params_.constraint && !(*std::max_element(logits_.begin(), logits_.end()) > kNegInf))
      processed = logits;
  }

  SampleResult result;
  // 3. Greedy is decided on the penalised logits.
  result.token =
      params_.temperature < kGreedyTemperature ? argmax(processed) : sample_truncated(processed);
  if (num_output < static_cast<int64_t>(params_.forced_tokens.size()))
    result.token = params_.forced_tokens[num_output];
  if (params_.logprobs) {
    const double log_sum = log_sum_exp(logits);  // of the raw (or constrained) logits
    result.logprob = static_cast<float>(static_cast<double>(logits[result.token]) - log_sum);
    const size_t count =
        params_.full_logprobs ? logits.size() : static_cast<size_t>(*params_.logprobs);
    if (count > 0) result.top = to_logprobs(top_ranked(logits, count), log_sum);
    // Tokens the constraint refuses have no probability: they are not among the top.
    if (params_.constraint)
      std::erase_if(result.top, [](const TokenLogprob& t) { return t.logprob == kNegInf; });
  }
  return result;
}

TokenId Sampler::sample(std::span<const float> logits) { return sample(logits, {}).token; }

std::vector<float> Sampler::processed_logits(std::span<const float> logits,
                                             const SequenceTokens& history) {
  update_history(history);
  if (params_.constraint) {
    update_grammar(history.output);
    logits = apply_constraint(logits);
  }
  std::vector<float> processed(logits.begin(), logits.end());
  apply_bias_and_penalties(processed, static_cast<int64_t>(history.output.size()));
  return processed;
}

}  // namespace sieve::engine
