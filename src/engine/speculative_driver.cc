#include "engine/speculative_driver.h"

#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>

#include "speculative/draft_length.h"
#include "speculative/ngram_proposer.h"
#include "speculative/self_sparse_view.h"
#include "util/clock.h"
#include "util/error.h"

namespace sieve::engine {

std::shared_ptr<const model::Model> SpeculativeDriver::load_draft_model(
    const EngineConfig& config, const model::Model& target, const tok::Tokenizer& tokenizer) {
  if (config.speculative.method != speculative::Method::kDraftModel) return nullptr;
  return DraftModelProposer::load(config.speculative.model, target, tokenizer, config.model_path);
}

SpeculativeDriver::SpeculativeDriver(const EngineConfig& config, const model::ModelConfig& target,
                                     std::shared_ptr<const model::Model> draft_model,
                                     int32_t num_pages, sched::Scheduler& scheduler,
                                     ModelRunner& runner)
    : config_(config), target_(target), scheduler_(scheduler), runner_(runner) {
  if (draft_model) {
    draft_ = std::make_unique<DraftModelProposer>(
        std::move(draft_model),
        DraftModelConfig{.num_pages = num_pages,
                         .page_size = config.page_size,
                         .enable_prefix_caching = config.enable_prefix_caching,
                         .kv_dtype = config.kv_dtype,
                         .max_batch_tokens = config.max_batch_tokens});
  }
}

void SpeculativeDriver::check(const speculative::SpeculativeConfig& speculative) const {
  switch (speculative.method) {
    case speculative::Method::kNone:
    case speculative::Method::kNgram:
      return;
    case speculative::Method::kSelfSparse:
      speculative::check_draft_policy(speculative.kv_policy);
      return;
    case speculative::Method::kDraftModel: {
      // One draft model per engine, loaded at start: a request may only name that one.
      if (!draft_) {
        fail(
            "this server loaded no draft model: draft_model needs one named at start "
            "(--speculative-config '{{\"method\": \"draft_model\", \"num_speculative_tokens\": "
            "4, \"model\": \"{}\"}}'); a server loads one draft model, at start",
            speculative.model);
      }
      const std::string& loaded = config_.speculative.model;
      std::error_code error;
      if (speculative.model != loaded &&
          !std::filesystem::equivalent(speculative.model, loaded, error)) {
        fail(
            "draft model '{}' is not the one this server loaded ('{}'): a server loads one draft "
            "model, at start, and requests may only use that one",
            speculative.model, loaded);
      }
      return;
    }
  }
}

// A sequence with a sparse KV policy gets no draft (see EngineConfig::speculative), nor one about
// to fork its n - 1 samples.
void SpeculativeDriver::propose(const Samples& samples) {
  const int32_t num_running = scheduler_.stats().num_running;
  std::vector<DraftModelProposer::Want> draft_model_wants;
  for (const auto& [seq, sample] : samples) {
    const speculative::SpeculativeConfig& config = sample->speculative;
    if (!config.enabled() || sample->sparsity || sample->num_samples_to_fork > 0) continue;
    if (config.disable_by_batch_size && num_running >= *config.disable_by_batch_size) continue;
    std::span<const int32_t> tokens = scheduler_.tokens(seq);
    // Decoding: the last token, sampled in the previous step, is the only one not computed.
    if (static_cast<int32_t>(tokens.size()) <= sample->num_prompt_tokens ||
        scheduler_.num_computed(seq) + 1 != static_cast<int32_t>(tokens.size()))
      continue;
    const int32_t k = sample->draft_length
                          ? sample->draft_length->next(config.draft_token_cost.value_or(
                                step_cost_.draft_token_cost(config.method, num_running)))
                          : config.num_speculative_tokens;
    const int32_t max_tokens = std::min(k, scheduler_.max_draft_tokens(seq));
    if (max_tokens <= 0) continue;
    if (config.method == speculative::Method::kSelfSparse) {
      // Placeholders: the draft passes need the step's pages, which schedule() reserves; they
      // fill the tokens in (draft_self_sparse).
      scheduler_.set_draft(seq,
                           std::vector<int32_t>(static_cast<size_t>(max_tokens), tokens.back()));
      continue;
    }
    if (config.method == speculative::Method::kDraftModel) {
      // Drafted below, all such sequences together.
      draft_model_wants.push_back({.seq = seq, .tokens = tokens, .max_drafts = max_tokens});
      continue;
    }
    const std::vector<int32_t> draft = speculative::propose_ngram(
        tokens, config.prompt_lookup_min, config.prompt_lookup_max, max_tokens);
    if (!draft.empty()) scheduler_.set_draft(seq, draft);
  }
  if (draft_model_wants.empty()) return;
  const auto start = Clock::now();
  const std::vector<std::vector<int32_t>> drafts = draft_->propose(draft_model_wants);
  int32_t num_rows = 0;  // one per drafted token: the passes' rows together
  for (const DraftModelProposer::Want& want : draft_model_wants) num_rows += want.max_drafts;
  step_cost_.record_draft_pass(speculative::Method::kDraftModel, num_rows,
                               seconds_between(start, Clock::now()));
  for (size_t i = 0; i < drafts.size(); ++i) {
    if (!drafts[i].empty()) scheduler_.set_draft(draft_model_wants[i].seq, drafts[i]);
  }
}

void SpeculativeDriver::draft(const sched::ScheduleOutput& out, const Samples& samples) {
  draft_self_sparse(out, samples);
  prefill_draft_model(out, samples);
}

// Self-speculation: draft pass j computes, for every self_sparse sequence with more than j drafts
// this step, its token at position num_computed_before + j (the last real token, then draft
// j - 1) reading only its draft view's pages, and takes the argmax as draft j. The passes write
// K/V at the positions the verification step computes next, so nothing needs undoing.
void SpeculativeDriver::draft_self_sparse(const sched::ScheduleOutput& out,
                                          const Samples& samples) {
  struct Drafting {
    sched::SeqId seq;
    int32_t first_position = 0;
    int32_t num_drafts = 0;
    const sparsity::PolicySpec* view = nullptr;
  };
  std::vector<Drafting> drafting;
  for (const sched::ScheduledSequence& scheduled : out.scheduled) {
    if (scheduled.num_draft_tokens == 0) continue;
    const Sample& sample = *samples.at(scheduled.seq_id);
    if (sample.speculative.method != speculative::Method::kSelfSparse) continue;
    drafting.push_back({.seq = scheduled.seq_id,
                        .first_position = scheduled.num_computed_before,
                        .num_drafts = scheduled.num_draft_tokens,
                        .view = &sample.speculative.kv_policy});
  }
  const auto vocab = static_cast<size_t>(target_.vocab_size);
  std::vector<ModelRunner::DraftRow> rows;
  for (int32_t j = 0;; ++j) {
    rows.clear();
    for (const Drafting& d : drafting) {
      if (j >= d.num_drafts) continue;
      const int32_t position = d.first_position + j;
      rows.push_back({.seq = d.seq,
                      .token = scheduler_.tokens(d.seq)[static_cast<size_t>(position)],
                      .position = position,
                      .num_verified = d.first_position,
                      .view = speculative::draft_view(*d.view, position, config_.page_size)});
    }
    if (rows.empty()) return;
    const auto start = Clock::now();
    const std::vector<float>& logits = runner_.run_draft(rows);
    step_cost_.record_draft_pass(speculative::Method::kSelfSparse,
                                 static_cast<int64_t>(rows.size()),
                                 seconds_between(start, Clock::now()));
    for (size_t r = 0; r < rows.size(); ++r) {
      const std::span<const float> row(&logits[r * vocab], vocab);
      scheduler_.set_draft_token(rows[r].seq, j, argmax(row));
    }
  }
}

// draft_model: the draft model computes the prompt chunks the target computes this step, for the
// sequences that will draft with it.
void SpeculativeDriver::prefill_draft_model(const sched::ScheduleOutput& out,
                                            const Samples& samples) {
  if (!draft_) return;
  std::vector<DraftModelProposer::Prefill> chunks;
  for (const sched::ScheduledSequence& scheduled : out.scheduled) {
    const Sample& sample = *samples.at(scheduled.seq_id);
    if (sample.speculative.method != speculative::Method::kDraftModel ||
        !sample.speculative.enabled() || sample.sparsity ||
        scheduled.num_computed_before >= sample.num_prompt_tokens)
      continue;
    chunks.push_back({.seq = scheduled.seq_id,
                      .tokens = scheduler_.tokens(scheduled.seq_id)
                                    .first(static_cast<size_t>(scheduled.num_computed_before +
                                                               scheduled.num_new_tokens))});
  }
  if (!chunks.empty()) draft_->prefill(chunks);
}

// Decode-only steps (no prompt chunk, whose cost is another matter) feed the step-time fit
// behind adaptive k's draft token cost.
void SpeculativeDriver::record_step_time(const sched::ScheduleOutput& out, double seconds) {
  int64_t tokens = 0;
  for (const sched::ScheduledSequence& scheduled : out.scheduled) {
    if (!scheduled.samples || scheduled.num_new_tokens != scheduled.num_draft_tokens + 1) return;
    tokens += scheduled.num_new_tokens;
  }
  step_cost_.record_step(tokens, static_cast<int64_t>(out.scheduled.size()), seconds);
}

// Speculative sampling with a deterministic draft (every proposer here drafts one token per
// position, so q is one-hot): the draft token d is accepted with probability min(1, p(d) / q(d))
// = p(d), and on rejection the token comes from max(0, p - q) renormalised, i.e. from p without d.
// Drawing x ~ p with the sequence's own sampler and accepting d iff x == d does both at once:
// P(accept) = p(d), and a rejection's x is p conditioned on x != d. p is the target's processed
// distribution at that position (penalties, bias, temperature, top-k/p, min-p, with the accepted
// drafts in the history), exactly what plain decoding samples from; each row draws one number
// from the sequence's RNG as plain decoding does, so with the same seed the output is the same
// token for token, not only in distribution.
std::vector<SampleResult> SpeculativeDriver::verify(sched::SeqId seq, Sample& sample,
                                                    std::span<const float> rows,
                                                    int32_t num_drafts) {
  const auto vocab = static_cast<size_t>(target_.vocab_size);
  std::span<const int32_t> tokens = scheduler_.tokens(seq);
  const size_t num_real = tokens.size() - static_cast<size_t>(num_drafts);
  const auto prompt = static_cast<size_t>(sample.num_prompt_tokens);
  std::vector<SampleResult> results;
  for (int32_t i = 0; i <= num_drafts; ++i) {
    const SequenceTokens history{.prompt = tokens.first(prompt),
                                 .output = tokens.subspan(prompt, num_real - prompt + i)};
    results.push_back(sample.sampler.sample(rows.subspan(i * vocab, vocab), history));
    if (i == num_drafts || results.back().token != tokens[num_real + i]) break;
  }
  return results;
}

void SpeculativeDriver::resolve(sched::SeqId seq, Sample& sample, int32_t num_drafts,
                                int32_t num_accepted, int32_t num_kept) {
  if (num_drafts == 0) return;
  scheduler_.resolve_draft(seq, num_kept);
  sample.spec_draft_tokens += num_drafts;
  sample.spec_accepted_tokens += num_accepted;
  ++num_drafts_;
  num_draft_tokens_ += num_drafts;
  num_accepted_tokens_ += num_accepted;
  if (sample.draft_length) sample.draft_length->record(num_drafts, num_accepted);
  for (int32_t i = 0; i < num_accepted; ++i) ++accepted_per_position_[static_cast<size_t>(i)];
}

void SpeculativeDriver::release(sched::SeqId seq) {
  if (draft_) draft_->release(seq);
}

void SpeculativeDriver::add_usage(sched::SeqId seq, Usage& usage) const {
  if (!draft_) return;
  usage.spec_draft_kv_pages = draft_->num_pages_held(seq);
  usage.spec_draft_kv_bytes = usage.spec_draft_kv_pages * draft_->kv_bytes_per_page();
}

SpeculativeStats SpeculativeDriver::stats() const {
  SpeculativeStats stats{.num_drafts = num_drafts_,
                         .num_draft_tokens = num_draft_tokens_,
                         .num_accepted_tokens = num_accepted_tokens_,
                         .accepted_per_position = accepted_per_position_};
  if (draft_) {
    stats.draft_kv = draft_->kv_stats();
    stats.draft_kv_bytes_per_page = draft_->kv_bytes_per_page();
  }
  return stats;
}

}  // namespace sieve::engine
