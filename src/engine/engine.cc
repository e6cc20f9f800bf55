#include "engine/engine.h"

#include <algorithm>
#include <cassert>
#include <filesystem>
#include <utility>
#include <fmt/format.h>

#include "sparsity/controller.h"
#include "spec/draft_length.h"
#include "spec/ngram_proposer.h"
#include "spec/self_sparse_view.h"
#include "util/error.h"

namespace sieve::engine {

namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The target's pages; a draft model's pool has as many (engine/draft_model.h), so each page of
// the budget costs both.
int32_t pages_for(const EngineConfig& config, const model::ModelConfig& model,
                  const model::LlamaModel* draft) {
  if (config.num_kv_pages > 0) return config.num_kv_pages;
  const size_t target_page_bytes =
      model::KvCache::bytes_per_page(model, config.page_size, config.kv_dtype);
  size_t page_bytes = target_page_bytes;
  if (draft) {
    page_bytes += model::KvCache::bytes_per_page(
        draft->config(), config.page_size,
        DraftModelProposer::kv_dtype_for(draft->config(), config.kv_dtype));
  }
  // The default is sized for the target's pages; a draft model's mirror pool comes on top.
  const uint64_t kv_memory_bytes = config.kv_memory_bytes ? *config.kv_memory_bytes
                                                          : default_kv_memory_bytes(model, config) /
                                                                target_page_bytes * page_bytes;
  const uint64_t pages = kv_memory_bytes / page_bytes;
  if (pages == 0) {
    fail("--kv-memory of {} bytes holds no page ({} bytes per page of {} tokens{})",
         kv_memory_bytes, page_bytes, config.page_size, draft ? ", target and draft model" : "");
  }
  return static_cast<int32_t>(std::min<uint64_t>(pages, 1u << 30));
}

// draft_model's drafter, when the engine's own speculative config names one.
std::shared_ptr<const model::LlamaModel> load_draft(const EngineConfig& config,
                                                    const model::LlamaModel& target,
                                                    const tok::Tokenizer& tokenizer) {
  if (config.speculative.method != spec::Method::kDraftModel) return nullptr;
  return DraftModelProposer::load(config.speculative.model, target, tokenizer, config.model_path);
}

constexpr const char* kQueueFullMessage = "the server is at its queue limit; retry later";

}  // namespace

uint64_t default_kv_memory_bytes(const model::ModelConfig& model, const EngineConfig& config) {
  const uint64_t page_bytes =
      model::KvCache::bytes_per_page(model, config.page_size, config.kv_dtype);
  const auto page_size = static_cast<uint64_t>(config.page_size);
  const uint64_t pages_per_sequence =
      (static_cast<uint64_t>(model.context_length) + page_size - 1) / page_size;
  const uint64_t wanted =
      page_bytes * pages_per_sequence * static_cast<uint64_t>(std::max(config.max_num_seqs, 1));
  return std::max<uint64_t>(page_bytes, std::min(wanted, kDefaultKvMemoryCapBytes));
}

struct Engine::PendingRequest {
  RequestId id = 0;
  Request request;
  SparseAdmission sparse;
  std::string policy_name;  // canonical kv_policy, for KV snapshots
  spec::SpeculativeConfig speculative;
  std::shared_ptr<EventSink> sink;
  Clock::time_point arrival;
};

Engine::Engine(const EngineConfig& config, std::shared_ptr<const model::LlamaModel> model,
               std::shared_ptr<const tok::Tokenizer> tokenizer)
    : config_(config),
      model_(std::move(model)),
      tokenizer_(std::move(tokenizer)),
      eos_ids_(tokenizer_->eog_ids().begin(), tokenizer_->eog_ids().end()),
      draft_model_(load_draft(config, *model_, *tokenizer_)),
      kv_(kv::KvConfig{.num_pages = pages_for(config, model_->config(), draft_model_.get()),
                       .page_size = config.page_size,
                       .enable_prefix_caching = config.enable_prefix_caching,
                       .num_layers = static_cast<int32_t>(model_->config().num_layers),
                       .num_kv_heads = static_cast<int32_t>(model_->config().num_kv_heads)}),
      cache_(model_->backend(), model_->config(), kv_.num_pages(), config.page_size,
             config.kv_dtype),
      kv_bytes_per_page_(static_cast<int64_t>(
          model::KvCache::bytes_per_page(model_->config(), config.page_size, config.kv_dtype))),
      scheduler_(sched::SchedulerConfig{.max_batch_tokens = config.max_batch_tokens,
                                        .max_num_seqs = config.max_num_seqs,
                                        .max_model_len =
                                            static_cast<int32_t>(model_->config().context_length)},
                 kv_),
      runner_(*model_, cache_, kv_),
      sparsity_(config_, model_->config(), *tokenizer_, kv_, scheduler_, runner_),
      outputs_(*tokenizer_, model_->config(), scheduler_, kv_, config.page_size,
               kv_bytes_per_page_),
      snapshots_({.page_size = config.page_size,
                  .bytes_per_page = kv_bytes_per_page_,
                  .kv_dtype = config.kv_dtype,
                  .num_layers = static_cast<int32_t>(model_->config().num_layers),
                  .num_kv_heads = static_cast<int32_t>(model_->config().num_kv_heads)},
                 kv_, scheduler_, samples_) {
  config_.num_kv_pages = kv_.num_pages();
  if (draft_model_) {
    draft_ = std::make_unique<DraftModelProposer>(
        draft_model_, DraftModelConfig{.num_pages = kv_.num_pages(),
                                       .page_size = config.page_size,
                                       .enable_prefix_caching = config.enable_prefix_caching,
                                       .kv_dtype = config.kv_dtype,
                                       .max_batch_tokens = config.max_batch_tokens});
  }
  if (kernels::is_block_kv_dtype(config.kv_dtype)) model_->ensure_key_smoothing();
  if (config_.calibration && config_.calibration->model_fingerprint != model_->fingerprint()) {
    fail(
        "the calibration profile was measured on model '{}' (fingerprint {}), not on this one "
        "(fingerprint {}); "
        "write one for this model with `sieve calibrate`",
        config_.calibration->model_name, config_.calibration->model_fingerprint,
        model_->fingerprint());
  }
  published_stats_.kv = kv_.stats();
  published_stats_.kv_bytes_per_page = kv_bytes_per_page_;
  if (draft_) {
    published_stats_.draft_kv = draft_->kv_stats();
    published_stats_.draft_kv_bytes_per_page = draft_->kv_bytes_per_page();
  }
}

Engine::~Engine() { stop(); }

std::variant<RequestId, AdmissionError> Engine::submit(Request request, EventSink sink) {
  using Kind = AdmissionError::Kind;
  const int64_t context = model_->config().context_length;
  const auto prompt_len = static_cast<int64_t>(request.prompt.size());
  if (prompt_len == 0) return AdmissionError::invalid("prompt", "the prompt is empty");
  if (auto problem = check_sampling_params(request.params,
                                           static_cast<int32_t>(model_->config().vocab_size))) {
    return *std::move(problem);
  }
  for (TokenId token : request.prompt) {
    if (token < 0 || token >= model_->config().vocab_size) {
      return AdmissionError::invalid(
          "prompt", fmt::format("prompt token id {} is outside the vocabulary", token));
    }
  }
  if (request.prompt_logprobs &&
      (*request.prompt_logprobs < 0 || *request.prompt_logprobs > kMaxTopLogprobs)) {
    return AdmissionError::invalid("prompt_logprobs",
                                   fmt::format("prompt_logprobs must be in [0, {}], got {}",
                                               kMaxTopLogprobs, *request.prompt_logprobs));
  }
  // max_tokens 0 only computes the prompt, which may then fill the context.
  const bool samples_nothing = request.params.max_tokens == 0;
  if (prompt_len > context || (prompt_len == context && !samples_nothing)) {
    return AdmissionError{Kind::kTooLong, "prompt",
                          fmt::format("the prompt has {} tokens but the context is {} (at least "
                                      "one token must be generated)",
                                      prompt_len, context)};
  }
  if (!request.params.max_tokens)
    request.params.max_tokens = static_cast<int32_t>(context - prompt_len);
  if (prompt_len + *request.params.max_tokens > context) {
    return AdmissionError{
        Kind::kTooLong, "max_tokens",
        fmt::format("prompt ({} tokens) + max_tokens ({}) exceeds the context of {} tokens",
                    prompt_len, *request.params.max_tokens, context)};
  }
  request.kv_policy = sparsity_.with_model_window(std::move(request.kv_policy));
  std::variant<SparseAdmission, AdmissionError> sparse =
      sparsity_.admit(request.kv_policy, prompt_len, *request.params.max_tokens, request.params.n);
  if (auto* refused = std::get_if<AdmissionError>(&sparse)) return std::move(*refused);
  const int64_t pages_needed = std::get<SparseAdmission>(sparse).pages_needed;
  spec::SpeculativeConfig speculative = request.speculative.value_or(config_.speculative);
  try {
    check_speculative(speculative);
  } catch (const Error& e) {
    return AdmissionError::invalid("speculative", e.what());
  }
  if (pages_needed > config_.num_kv_pages) {
    return AdmissionError{
        Kind::kNeverFits, std::nullopt,
        fmt::format("the request needs {} KV pages ({} MiB of {} K/V) but the pool has {}; "
                    "lower max_tokens or give the server more --kv-memory",
                    pages_needed, (pages_needed * kv_bytes_per_page_ + (1 << 20) - 1) >> 20,
                    model::kv_dtype_name(config_.kv_dtype), config_.num_kv_pages)};
  }
  std::lock_guard lock(mutex_);
  if (published_stats_.num_waiting + static_cast<int64_t>(pending_.size()) >= config_.max_queued) {
    return AdmissionError{Kind::kQueueFull, std::nullopt, kQueueFullMessage};
  }
  auto pending = std::make_unique<PendingRequest>();
  pending->id = next_request_id_++;
  pending->request = std::move(request);
  pending->sink = std::make_shared<EventSink>(std::move(sink));
  pending->arrival = Clock::now();
  pending->sparse = std::get<SparseAdmission>(std::move(sparse));
  pending->speculative = std::move(speculative);
  pending->policy_name = sparsity::to_string(pending->request.kv_policy);  // off the engine thread
  const RequestId id = pending->id;
  pending_.push_back(std::move(pending));
  work_available_.notify_one();
  return id;
}

void Engine::check_speculative(const spec::SpeculativeConfig& speculative) const {
  switch (speculative.method) {
    case spec::Method::kNone:
    case spec::Method::kNgram:
      return;
    case spec::Method::kSelfSparse:
      spec::check_draft_policy(speculative.kv_policy);
      return;
    case spec::Method::kDraftModel: {
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

// Decoding sequences that speculate get their draft for this step. A sequence with a sparse KV
// policy does not (see EngineConfig::speculative), nor one about to fork its n - 1 samples.
void Engine::propose_drafts() {
  const int32_t num_running = scheduler_.stats().num_running;
  std::vector<DraftModelProposer::Want> draft_model_wants;
  for (auto& [seq, sample] : samples_) {
    const spec::SpeculativeConfig& config = sample->speculative;
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
    if (config.method == spec::Method::kSelfSparse) {
      // Placeholders: the draft passes need the step's pages, which schedule() reserves; they
      // fill the tokens in (draft_self_sparse).
      scheduler_.set_draft(seq,
                           std::vector<int32_t>(static_cast<size_t>(max_tokens), tokens.back()));
      continue;
    }
    if (config.method == spec::Method::kDraftModel) {
      // Drafted below, all such sequences together.
      draft_model_wants.push_back({.seq = seq, .tokens = tokens, .max_drafts = max_tokens});
      continue;
    }
    const std::vector<int32_t> draft =
        spec::propose_ngram(tokens, config.prompt_lookup_min, config.prompt_lookup_max, max_tokens);
    if (!draft.empty()) scheduler_.set_draft(seq, draft);
  }
  if (draft_model_wants.empty()) return;
  const auto start = Clock::now();
  const std::vector<std::vector<int32_t>> drafts = draft_->propose(draft_model_wants);
  int32_t num_rows = 0;  // one per drafted token: the passes' rows together
  for (const DraftModelProposer::Want& want : draft_model_wants) num_rows += want.max_drafts;
  step_cost_.record_draft_pass(spec::Method::kDraftModel, num_rows,
                               seconds_between(start, Clock::now()));
  for (size_t i = 0; i < drafts.size(); ++i) {
    if (!drafts[i].empty()) scheduler_.set_draft(draft_model_wants[i].seq, drafts[i]);
  }
}

void Engine::forget(sched::SeqId seq) {
  runner_.forget(seq);
  if (draft_) draft_->release(seq);
}

// Self-speculation: draft pass j computes, for every self_sparse sequence with more than j drafts
// this step, its token at position num_computed_before + j (the last real token, then draft
// j - 1) reading only its draft view's pages, and takes the argmax as draft j. The passes write
// K/V at the positions the verification step computes next, so nothing needs undoing.
void Engine::draft_self_sparse(const sched::ScheduleOutput& out) {
  struct Drafting {
    sched::SeqId seq;
    int32_t first_position = 0;
    int32_t num_drafts = 0;
    const sparsity::PolicySpec* view = nullptr;
  };
  std::vector<Drafting> drafting;
  for (const sched::ScheduledSequence& scheduled : out.scheduled) {
    if (scheduled.num_draft_tokens == 0) continue;
    const Sample& sample = *samples_.at(scheduled.seq_id);
    if (sample.speculative.method != spec::Method::kSelfSparse) continue;
    drafting.push_back({.seq = scheduled.seq_id,
                        .first_position = scheduled.num_computed_before,
                        .num_drafts = scheduled.num_draft_tokens,
                        .view = &sample.speculative.kv_policy});
  }
  const auto vocab = static_cast<size_t>(model_->config().vocab_size);
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
                      .view = spec::draft_view(*d.view, position, config_.page_size)});
    }
    if (rows.empty()) return;
    const auto start = Clock::now();
    const std::vector<float>& logits = runner_.run_draft(rows);
    step_cost_.record_draft_pass(spec::Method::kSelfSparse, static_cast<int64_t>(rows.size()),
                                 seconds_between(start, Clock::now()));
    for (size_t r = 0; r < rows.size(); ++r) {
      const std::span<const float> row(&logits[r * vocab], vocab);
      scheduler_.set_draft_token(rows[r].seq, j, argmax(row));
    }
  }
}

// draft_model: the draft model computes the prompt chunks the target computes this step, for the
// sequences that will draft with it.
void Engine::prefill_draft_model(const sched::ScheduleOutput& out) {
  if (!draft_) return;
  std::vector<DraftModelProposer::Prefill> chunks;
  for (const sched::ScheduledSequence& scheduled : out.scheduled) {
    const Sample& sample = *samples_.at(scheduled.seq_id);
    if (sample.speculative.method != spec::Method::kDraftModel || !sample.speculative.enabled() ||
        sample.sparsity || scheduled.num_computed_before >= sample.num_prompt_tokens)
      continue;
    chunks.push_back({.seq = scheduled.seq_id,
                      .tokens = scheduler_.tokens(scheduled.seq_id)
                                    .first(static_cast<size_t>(scheduled.num_computed_before +
                                                               scheduled.num_new_tokens))});
  }
  if (!chunks.empty()) draft_->prefill(chunks);
}

void Engine::cancel(RequestId id) {
  std::lock_guard lock(mutex_);
  cancelled_.push_back(id);
  work_available_.notify_one();
}

// Pending requests become waiting sequences: submit() checked and planned them already.
void Engine::admit() {
  std::vector<std::unique_ptr<PendingRequest>> pending;
  {
    std::lock_guard lock(mutex_);
    pending.swap(pending_);
  }
  for (auto& p : pending) {
    // submit() counted the queue from the last step's stats; this is the scheduler's own count.
    if (scheduler_.stats().num_waiting >= config_.max_queued) {
      const AdmissionError refused{AdmissionError::Kind::kQueueFull, std::nullopt,
                                   kQueueFullMessage};
      (*p->sink)(RequestEvent{.request_id = p->id,
                              .finish = Finish{FinishReason::kStop},
                              .error = refused.message,
                              .refused = refused});
      continue;
    }
    const sched::SeqId seq{next_seq_id_++};
    const int32_t n = std::max(1, p->request.params.n);
    auto sample = std::make_unique<Sample>(
        p->id, 0, p->sink, params_for_sample(p->request.params, 0), eos_ids_,
        static_cast<int32_t>(p->request.prompt.size()), p->arrival);
    sample->num_samples_to_fork = n - 1;
    sample->sparsity = std::move(p->sparse.controller);
    sample->label = std::make_shared<const RequestLabel>(std::move(p->request.label));
    sample->policy_name = std::make_shared<const std::string>(std::move(p->policy_name));
    sample->chunk_boundary = p->sparse.chunk_boundary;
    sample->speculative = p->speculative;
    if (p->speculative.adaptive)
      sample->draft_length.emplace(p->speculative.num_speculative_tokens);
    sample->prompt_logprobs = p->request.prompt_logprobs;
    if (sample->prompt_logprobs) sample->prompt_rows.push_back({.token = p->request.prompt[0]});
    const int32_t max_new = *p->request.params.max_tokens;
    scheduler_.add(
        seq, std::move(p->request.prompt), max_new,
        {.max_pages = sample->sparsity ? std::optional(p->sparse.pages_needed) : std::nullopt,
         .chunk_boundary = p->sparse.chunk_boundary,
         .private_kv = p->sparse.private_kv,
         .prompt_logits = sample->prompt_logprobs.has_value()});
    samples_.emplace(seq, std::move(sample));
  }
}

void Engine::apply_cancellations() {
  std::vector<RequestId> cancelled;
  {
    std::lock_guard lock(mutex_);
    cancelled.swap(cancelled_);
  }
  for (RequestId id : cancelled) {
    for (auto it = samples_.begin(); it != samples_.end();) {
      if (it->second->request_id != id) {
        ++it;
        continue;
      }
      scheduler_.finish(it->first);
      forget(it->first);
      RequestEvent event{.request_id = id,
                         .sample_idx = it->second->sample_idx,
                         .finish = Finish{FinishReason::kStop},
                         .error = "cancelled",
                         .cancelled = true};
      (*it->second->sink)(event);
      it = samples_.erase(it);
    }
  }
}

// The event goes to the sample's sink; a finishing sample's usage is taken first, then its
// sequence and pages go.
void Engine::send(sched::SeqId seq, Sample& sample, RequestEvent event) {
  if (event.finish) finish_sample(seq, sample, event);
  (*sample.sink)(event);
  if (event.finish) samples_.erase(seq);
}

void Engine::finish_sample(sched::SeqId seq, Sample& sample, RequestEvent& event) {
  outputs_.finish(seq, sample, event);
  if (draft_) {
    event.usage.spec_draft_kv_pages = draft_->num_pages_held(seq);
    event.usage.spec_draft_kv_bytes = event.usage.spec_draft_kv_pages * draft_->kv_bytes_per_page();
  }
  forget(seq);
  scheduler_.finish(seq);
}

std::vector<sched::SeqId> Engine::fork_samples(sched::SeqId seq, Sample& first) {
  std::vector<sched::SeqId> seqs = {seq};
  // The request's parameters (sample 0 has its seed, but n = 1).
  SamplingParams request_params = first.params;
  request_params.n = first.num_samples_to_fork + 1;
  for (int32_t i = 1; i <= first.num_samples_to_fork; ++i) {
    const sched::SeqId child{next_seq_id_++};
    // A compressed parent's child gets copies of its slices (before anything changes them).
    runner_.copy_slices(scheduler_.fork(seq, child));
    auto sample = std::make_unique<Sample>(first.request_id, i, first.sink,
                                           params_for_sample(request_params, i), eos_ids_,
                                           first.num_prompt_tokens, first.arrival);
    sample->first_scheduled = first.first_scheduled;
    sample->timings.queue_seconds = first.timings.queue_seconds;
    sample->cached_prompt_tokens = first.cached_prompt_tokens;
    // A sparse parent's child has its keys, so it continues from its policies' state.
    if (first.sparsity)
      sample->sparsity = std::make_unique<sparsity::SparsityController>(*first.sparsity);
    sample->label = first.label;
    sample->policy_name = first.policy_name;
    sample->chunk_boundary = first.chunk_boundary;
    sample->speculative = first.speculative;
    sample->draft_length = first.draft_length;
    sample->unsent_prompt_logprobs = first.unsent_prompt_logprobs;
    samples_.emplace(child, std::move(sample));
    seqs.push_back(child);
  }
  first.num_samples_to_fork = 0;
  return seqs;
}

// For each scheduled sequence, its rows in order: prompt rows to the output stage; a prefill
// chunk that ended on a chunk boundary is marked for compression; a sampling row gives each of
// the request's samples its tokens: verify (sample) → stop → event.
void Engine::process_outputs(const sched::ScheduleOutput& out, const std::vector<float>& logits) {
  const auto vocab = static_cast<size_t>(model_->config().vocab_size);
  const auto now = Clock::now();
  size_t row = 0;
  const auto take_rows = [&](int32_t num_rows) {  // the next rows of `logits`, [rows][vocab]
    const std::span<const float> rows(logits.data() + row * vocab,
                                      static_cast<size_t>(num_rows) * vocab);
    row += static_cast<size_t>(num_rows);
    return rows;
  };
  for (const sched::ScheduledSequence& scheduled : out.scheduled) {
    Sample& first = *samples_.at(scheduled.seq_id);
    outputs_.on_scheduled(scheduled, first, take_rows(scheduled.num_prompt_logits), now);
    if (!scheduled.samples) {
      sparsity_.on_prefill_chunk(scheduled, first);
      continue;
    }
    const std::span<const float> rows = take_rows(scheduled.num_draft_tokens + 1);
    outputs_.on_prompt_done(first);

    // n > 1: the other samples start here, sharing every prompt page, from the same logits (a
    // sequence that forks has no draft).
    const std::vector<sched::SeqId> seqs = first.num_samples_to_fork > 0
                                               ? fork_samples(scheduled.seq_id, first)
                                               : std::vector<sched::SeqId>{scheduled.seq_id};
    for (sched::SeqId seq : seqs) {
      Sample& sample = *samples_.at(seq);
      if (sample.params.max_tokens == 0) {
        send(seq, sample, outputs_.finish_unsampled(sample));
        continue;
      }
      sparsity_.on_prompt_done(seq, sample);
      std::vector<SampleResult> results =
          verify_draft(seq, sample, rows, scheduled.num_draft_tokens);
      emit_tokens(seq, sample, results, scheduled.num_draft_tokens, now);
    }
  }
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
std::vector<SampleResult> Engine::verify_draft(sched::SeqId seq, Sample& sample,
                                               std::span<const float> rows, int32_t num_drafts) {
  const auto vocab = static_cast<size_t>(model_->config().vocab_size);
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

void Engine::emit_tokens(sched::SeqId seq, Sample& sample, std::span<SampleResult> results,
                         int32_t num_drafts, Clock::time_point now) {
  const auto num_accepted = static_cast<int32_t>(results.size()) - 1;
  const int64_t num_known = static_cast<int64_t>(scheduler_.tokens(seq).size()) - num_drafts;
  // A stop inside the accepted drafts ends the sample there.
  RequestEvent event = outputs_.emit(sample, results, num_known, now);
  const auto num_emitted = static_cast<int32_t>(event.tokens.size());
  const int32_t kept_drafts = std::min(num_accepted, num_emitted);
  if (num_drafts > 0) {
    scheduler_.resolve_draft(seq, kept_drafts);
    sample.spec_draft_tokens += num_drafts;
    sample.spec_accepted_tokens += num_accepted;
    ++spec_num_drafts_;
    spec_num_draft_tokens_ += num_drafts;
    spec_num_accepted_tokens_ += num_accepted;
    if (sample.draft_length) sample.draft_length->record(num_drafts, num_accepted);
    for (int32_t i = 0; i < num_accepted; ++i)
      ++spec_accepted_per_position_[static_cast<size_t>(i)];
  }
  if (num_emitted > kept_drafts) scheduler_.append_token(seq, event.tokens.back());
  send(seq, sample, std::move(event));
}

// A preempted sequence is recomputed from its tokens as a dense one: compress again when that is
// done. Its draft model pages go back too (it drafts again once it decodes), and the runner's
// key summaries (Quest's, a Quest draft view's), which describe K about to be recomputed.
void Engine::restart_preempted(const std::vector<sched::SeqId>& preempted) {
  for (sched::SeqId seq : preempted) {
    if (draft_) draft_->release(seq);
    runner_.forget(seq);
    if (auto it = samples_.find(seq); it != samples_.end()) sparsity_.on_preempted(*it->second);
  }
}

bool Engine::step() {
  // Admit first, so that a request cancelled before its first step is found and stopped.
  admit();
  apply_cancellations();
  // Between steps, finished and cancelled sequences gone: a consistent view for snapshots.
  if (snapshots_.asked()) snapshots_.serve();
  propose_drafts();
  sched::ScheduleOutput out = scheduler_.schedule();
  restart_preempted(out.preempted);
  const bool did_work = !out.empty();
  if (did_work) {
    sparsity_.plan_rows(out, samples_);
    runner_.copy_pages(out);
    draft_self_sparse(out);
    prefill_draft_model(out);
    const auto run_start = Clock::now();
    const std::vector<float>& logits = runner_.run(
        out, [&](sched::SeqId seq) { return scheduler_.tokens(seq); },
        [&](sched::SeqId seq) { return sparsity_.row_requests(seq); });
    record_step_cost(out, seconds_between(run_start, Clock::now()));
    scheduler_.on_step_done(out);
    process_outputs(out, logits);
    sparsity_.after_step(samples_);
    ++num_steps_;
  }
  publish_stats();
  return did_work;
}

// Decode-only steps (no prompt chunk, whose cost is another matter) feed the step-time fit
// behind adaptive k's draft token cost.
void Engine::record_step_cost(const sched::ScheduleOutput& out, double seconds) {
  int64_t tokens = 0;
  for (const sched::ScheduledSequence& scheduled : out.scheduled) {
    if (!scheduled.samples || scheduled.num_new_tokens != scheduled.num_draft_tokens + 1) return;
    tokens += scheduled.num_new_tokens;
  }
  step_cost_.record_step(tokens, static_cast<int64_t>(out.scheduled.size()), seconds);
}

void Engine::publish_stats() {
  EngineStats stats{.num_running = scheduler_.stats().num_running,
                    .num_waiting = scheduler_.stats().num_waiting,
                    .num_preemptions = scheduler_.stats().num_preemptions,
                    .num_steps = num_steps_,
                    .num_prompt_tokens_computed = outputs_.num_prompt_tokens_computed(),
                    .num_generated_tokens = outputs_.num_generated_tokens(),
                    .spec_num_drafts = spec_num_drafts_,
                    .spec_num_draft_tokens = spec_num_draft_tokens_,
                    .spec_num_accepted_tokens = spec_num_accepted_tokens_,
                    .spec_accepted_per_position = spec_accepted_per_position_,
                    .kv = kv_.stats(),
                    .kv_bytes_per_page = kv_bytes_per_page_};
  if (draft_) {
    stats.draft_kv = draft_->kv_stats();
    stats.draft_kv_bytes_per_page = draft_->kv_bytes_per_page();
  }
  {
    std::lock_guard lock(mutex_);
    published_stats_ = stats;
  }
  snapshots_.publish();
}

void Engine::run_until_idle() {
  for (;;) {
    const bool did_work = step();
    std::lock_guard lock(mutex_);
    if (!did_work && pending_.empty() && cancelled_.empty() && scheduler_.idle()) return;
  }
}

void Engine::start() {
  if (loop_.joinable()) return;
  stop_requested_ = false;
  loop_ = std::thread([this] {
    while (!stop_requested_) {
      if (step()) continue;
      std::unique_lock lock(mutex_);
      work_available_.wait_for(lock, std::chrono::milliseconds(50), [&] {
        return stop_requested_ || !pending_.empty() || !cancelled_.empty() || snapshots_.asked();
      });
    }
  });
}

void Engine::stop() {
  if (loop_.joinable()) {
    {
      std::lock_guard lock(mutex_);
      stop_requested_ = true;
      work_available_.notify_all();
    }
    loop_.join();
  }
  snapshots_.serve();  // nothing steps now: answer what was asked meanwhile
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mutex_);
  return published_stats_;
}

void Engine::request_kv_snapshot(KvSnapshotQuery query, KvSnapshotSink done) {
  if (!snapshots_.request(std::move(query), std::move(done))) return;
  std::lock_guard lock(mutex_);  // taken, so that a loop about to wait sees the ask
  work_available_.notify_one();
}

}  // namespace sieve::engine
