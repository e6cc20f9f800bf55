#include "engine/engine.h"

#include <algorithm>
#include <utility>
#include <fmt/format.h>

#include "util/clock.h"
#include "util/error.h"

namespace sieve::engine {

namespace {

// The target's pages; a draft model's pool has as many (engine/draft_model.h), so each page of
// the budget costs both.
int32_t pages_for(const EngineConfig& config, const model::ModelConfig& model,
                  int64_t num_precise_streams, const model::Model* draft) {
  if (config.num_kv_pages > 0) return config.num_kv_pages;
  const size_t target_page_bytes =
      model::KvCache::bytes_per_page(model, config.page_size, config.kv_dtype, num_precise_streams);
  size_t page_bytes = target_page_bytes;
  if (draft) {
    page_bytes += model::KvCache::bytes_per_page(
        draft->config(), config.page_size,
        DraftModelProposer::kv_dtype_for(draft->config(), config.kv_dtype));
  }
  // The default is sized for the target's pages; a draft model's mirror pool and the precise
  // streams' f16 rows come on top.
  const uint64_t kv_memory_bytes =
      config.kv_memory_bytes
          ? *config.kv_memory_bytes
          : default_kv_memory_bytes(model, config) /
                model::KvCache::bytes_per_page(model, config.page_size, config.kv_dtype) *
                page_bytes;
  const uint64_t pages = kv_memory_bytes / page_bytes;
  if (pages == 0) {
    fail("--kv-memory of {} bytes holds no page ({} bytes per page of {} tokens{})",
         kv_memory_bytes, page_bytes, config.page_size, draft ? ", target and draft model" : "");
  }
  return static_cast<int32_t>(std::min<uint64_t>(pages, 1u << 30));
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
  speculative::SpeculativeConfig speculative;
  std::shared_ptr<EventSink> sink;
  Clock::time_point arrival;
};

Engine::Engine(const EngineConfig& config, std::shared_ptr<const model::Model> model,
               std::shared_ptr<const tok::Tokenizer> tokenizer)
    : Engine(config, model, tokenizer,
             SpeculativeDriver::load_draft_model(config, *model, *tokenizer)) {}

Engine::Engine(const EngineConfig& config, std::shared_ptr<const model::Model> model,
               std::shared_ptr<const tok::Tokenizer> tokenizer,
               std::shared_ptr<const model::Model> draft_model)
    : config_(config),
      model_(std::move(model)),
      tokenizer_(std::move(tokenizer)),
      eos_ids_(tokenizer_->eog_ids().begin(), tokenizer_->eog_ids().end()),
      precise_kv_streams_(config.precise_kv_heads ? model_->precise_kv_streams(config.kv_dtype)
                                                  : std::vector<int32_t>{}),
      kv_([&] {
        const int32_t num_pages =
            pages_for(config, model_->config(), std::ssize(precise_kv_streams_), draft_model.get());
        return kv::KvConfig{
            .num_pages = num_pages,
            .page_size = config.page_size,
            .enable_prefix_caching = config.enable_prefix_caching,
            .max_parked_pages = static_cast<int32_t>(std::clamp(config.max_parked_share, 0.0, 1.0) *
                                                     static_cast<double>(num_pages)),
            .num_layers = static_cast<int32_t>(model_->config().num_layers),
            .num_kv_heads = static_cast<int32_t>(model_->config().num_kv_heads),
            .precise_streams = precise_kv_streams_,
            .num_spare_areas =
                model::KvCache::spare_areas_for(num_pages, std::ssize(precise_kv_streams_))};
      }()),
      cache_(model_->backend(), model_->config(), kv_.num_pages(), config.page_size,
             config.kv_dtype, precise_kv_streams_, kv_.config().num_spare_areas),
      kv_bytes_per_page_(static_cast<int64_t>(model::KvCache::bytes_per_page(
          model_->config(), config.page_size, config.kv_dtype, std::ssize(precise_kv_streams_)))),
      scheduler_(sched::SchedulerConfig{.max_batch_tokens = config.max_batch_tokens,
                                        .max_num_seqs = config.max_num_seqs,
                                        .max_model_len =
                                            static_cast<int32_t>(model_->config().context_length)},
                 kv_),
      runner_(*model_, cache_, kv_),
      speculative_(config_, model_->config(), std::move(draft_model), kv_.num_pages(), scheduler_,
                   runner_),
      sparsity_(config_, model_->config(), *tokenizer_, kv_, scheduler_, runner_),
      outputs_(*tokenizer_, model_->config(), scheduler_, kv_, config.page_size,
               kv_bytes_per_page_),
      snapshots_({.page_size = config.page_size,
                  .bytes_per_page = kv_bytes_per_page_,
                  .kv_dtype = config.kv_dtype,
                  .num_layers = static_cast<int32_t>(model_->config().num_layers),
                  .num_kv_heads = static_cast<int32_t>(model_->config().num_kv_heads),
                  .precise_streams = precise_kv_streams_},
                 kv_, scheduler_, samples_) {
  config_.num_kv_pages = kv_.num_pages();
  model_->prepare_cache(cache_);
  if (config_.calibration && config_.calibration->model_fingerprint != model_->fingerprint()) {
    fail(
        "the calibration profile was measured on model '{}' (fingerprint {}), not on this one "
        "(fingerprint {}); "
        "write one for this model with `sieve calibrate`",
        config_.calibration->model_name, config_.calibration->model_fingerprint,
        model_->fingerprint());
  }
  const SpeculativeStats spec = speculative_.stats();
  published_stats_.kv = kv_.stats();
  published_stats_.kv_bytes_per_page = kv_bytes_per_page_;
  published_stats_.draft_kv = spec.draft_kv;
  published_stats_.draft_kv_bytes_per_page = spec.draft_kv_bytes_per_page;
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
  if (!request.then_prompt.empty() && request.given_output.empty()) {
    return AdmissionError::invalid("then_prompt", "then_prompt follows given_output");
  }
  if (prompt_len + static_cast<int64_t>(request.then_prompt.size()) + *request.params.max_tokens >
      context) {
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
  speculative::SpeculativeConfig speculative = request.speculative.value_or(config_.speculative);
  try {
    speculative_.check(speculative);
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

void Engine::forget(sched::SeqId seq) {
  runner_.forget(seq);
  speculative_.release(seq);
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
    sample->given_output = std::move(p->request.given_output);
    sample->then_prompt = std::move(p->request.then_prompt);
    const int32_t max_new = *p->request.params.max_tokens;
    const int32_t continued = continue_parked(seq, *sample, p->request.prompt);
    sample->continued_prompt_tokens = continued;
    scheduler_.add(
        seq, std::move(p->request.prompt), max_new,
        {.max_pages = sample->sparsity ? std::optional(p->sparse.pages_needed) : std::nullopt,
         .chunk_boundary = p->sparse.chunk_boundary,
         .private_kv = p->sparse.private_kv,
         .prompt_logits = sample->prompt_logprobs.has_value(),
         .num_computed = continued});
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
      snapshots_.record_finished(it->first, *it->second, "cancelled");
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

// A finishing sample's usage is taken first, then its sequence and pages go.
void Engine::send(sched::SeqId seq, Sample& sample, RequestEvent event) {
  if (event.finish) finish_sample(seq, sample, event);
  (*sample.sink)(event);
  if (event.finish) samples_.erase(seq);
}

void Engine::finish_sample(sched::SeqId seq, Sample& sample, RequestEvent& event) {
  outputs_.finish(seq, sample, event);
  speculative_.add_usage(seq, event.usage);
  snapshots_.record_finished(seq, sample, finish_reason_name(event.finish->reason));
  if (can_park(seq, sample, event)) {
    // The step's end as the sequence would have seen it, then its state waits for a next turn.
    sparsity_.settle(seq, sample);
    speculative_.release(seq);
    parked_.emplace(seq, ParkedState{.sparsity = std::move(sample.sparsity),
                                     .attention_recovery = sample.attention_recovery});
    scheduler_.finish_and_park(seq, parking_key(sample));
    return;
  }
  forget(seq);
  scheduler_.finish(seq);
}

uint64_t Engine::parking_key(const Sample& sample) {
  // The K/V and the controller's state depend on the policy (the model and KV dtype are the
  // engine's own); never 0, the prefix cache's "none".
  return std::hash<std::string>{}(*sample.policy_name) | 1;
}

bool Engine::can_park(sched::SeqId seq, const Sample& sample, const RequestEvent& event) const {
  return kv_.config().max_parked_pages > 0 && sample.sparsity && !event.cancelled && !event.error &&
         sample.then_prompt.empty() && scheduler_.is_running(seq) &&
         scheduler_.num_draft_tokens(seq) == 0 && scheduler_.num_computed(seq) > 0;
}

int32_t Engine::continue_parked(sched::SeqId seq, Sample& sample, std::span<const TokenId> prompt) {
  if (!sample.sparsity || sample.prompt_logprobs || kv_.config().max_parked_pages == 0) return 0;
  const std::optional<kv::ParkedMatch> hit = kv_.lookup_parked(prompt, parking_key(sample));
  if (!hit) return 0;
  auto parked = parked_.find(hit->seq);
  if (parked == parked_.end()) return 0;  // cannot happen: parked with its state
  kv_.adopt(hit->seq, seq, static_cast<int32_t>(prompt.size()));
  runner_.rename(hit->seq, seq);
  sample.sparsity = std::move(parked->second.sparsity);
  sample.sparsity->begin_prompt();
  sample.attention_recovery = parked->second.attention_recovery;
  parked_.erase(parked);
  ++num_continued_requests_;
  num_continued_tokens_ += hit->num_tokens;
  return hit->num_tokens;
}

void Engine::serve_prefix_cache_resets() {
  // Relaxed: the one thing a step reads when nobody asked (the lock orders the rest).
  if (!prefix_cache_reset_asked_.load(std::memory_order_relaxed)) return;
  std::vector<ResetSink> asks;
  bool idle = false;
  {
    std::lock_guard lock(mutex_);
    prefix_cache_reset_asked_ = false;
    asks.swap(prefix_cache_resets_);
    idle = pending_.empty() && cancelled_.empty();
  }
  if (asks.empty()) return;
  const bool reset = idle && scheduler_.idle() && kv_.reset_prefix_cache();
  forget_evicted_parked();
  for (ResetSink& done : asks) done(reset);
}

void Engine::request_prefix_cache_reset(ResetSink done) {
  std::lock_guard lock(mutex_);
  prefix_cache_resets_.push_back(std::move(done));
  prefix_cache_reset_asked_ = true;
  work_available_.notify_one();
}

void Engine::forget_evicted_parked() {
  for (sched::SeqId seq : kv_.take_evicted_parked()) {
    parked_.erase(seq);
    runner_.forget(seq);
  }
}

std::vector<sched::SeqId> Engine::fork_samples(sched::SeqId seq, Sample& first) {
  std::vector<sched::SeqId> seqs = {seq};
  // The request's parameters (sample 0 has its seed, but n = 1).
  SamplingParams request_params = first.params;
  request_params.n = first.num_samples_to_fork + 1;
  for (int32_t i = 1; i <= first.num_samples_to_fork; ++i) {
    const sched::SeqId child{next_seq_id_++};
    // A compressed parent's child gets copies of its slices (before anything changes them).
    runner_.apply(scheduler_.fork(seq, child));
    auto sample = std::make_unique<Sample>(first.request_id, i, first.sink,
                                           params_for_sample(request_params, i), eos_ids_,
                                           first.num_prompt_tokens, first.arrival);
    sample->first_scheduled = first.first_scheduled;
    sample->timings.queue_seconds = first.timings.queue_seconds;
    sample->cached_prompt_tokens = first.cached_prompt_tokens;
    sample->continued_prompt_tokens = first.continued_prompt_tokens;
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
          speculative_.verify(seq, sample, rows, scheduled.num_draft_tokens);
      if (sample.num_given_used < sample.given_output.size()) {
        results.resize(1);  // the reference decodes one given token a step
        results[0].token = sample.given_output[sample.num_given_used++];
      }
      const bool then_prompt_now =
          !sample.then_prompt.empty() && sample.num_given_used == sample.given_output.size();
      emit_tokens(seq, sample, results, scheduled.num_draft_tokens, now);
      if (then_prompt_now && samples_.contains(seq)) {
        scheduler_.extend_prompt(seq, sample.then_prompt);
        sparsity_.on_prompt_extended(seq);
        sample.then_prompt.clear();
      }
    }
  }
}

void Engine::emit_tokens(sched::SeqId seq, Sample& sample, std::span<SampleResult> results,
                         int32_t num_drafts, Clock::time_point now) {
  const auto num_accepted = static_cast<int32_t>(results.size()) - 1;
  const int64_t num_known = static_cast<int64_t>(scheduler_.tokens(seq).size()) - num_drafts;
  // A stop inside the accepted drafts ends the sample there.
  RequestEvent event = outputs_.emit(sample, results, num_known, now);
  const auto num_emitted = static_cast<int32_t>(event.tokens.size());
  const int32_t kept_drafts = std::min(num_accepted, num_emitted);
  speculative_.resolve(seq, sample, num_drafts, num_accepted, kept_drafts);
  if (num_emitted > kept_drafts) scheduler_.append_token(seq, event.tokens.back());
  send(seq, sample, std::move(event));
}

// A preempted sequence is recomputed from its tokens as a dense one: compress again when that is
// done. Its draft model pages go back too (it drafts again once it decodes), and the runner's
// key summaries (Quest's, a Quest draft view's), which describe K about to be recomputed.
void Engine::restart_preempted(const std::vector<sched::SeqId>& preempted) {
  for (sched::SeqId seq : preempted) {
    forget(seq);
    if (auto it = samples_.find(seq); it != samples_.end()) sparsity_.on_preempted(*it->second);
  }
}

const std::vector<float>& Engine::run_model(const sched::ScheduleOutput& out) {
  const auto start = Clock::now();
  const std::vector<float>& logits = runner_.run(
      out, [&](sched::SeqId seq) { return scheduler_.tokens(seq); },
      [&](sched::SeqId seq) { return sparsity_.row_requests(seq); });
  speculative_.record_step_time(out, seconds_between(start, Clock::now()));
  return logits;
}

bool Engine::step() {
  // Admit first, so that a request cancelled before its first step is found and stopped.
  admit();
  apply_cancellations();
  // Between steps, finished and cancelled sequences gone: a consistent view for snapshots.
  if (snapshots_.asked()) snapshots_.serve();
  serve_prefix_cache_resets();
  speculative_.propose(samples_);
  sched::ScheduleOutput out = scheduler_.schedule();
  restart_preempted(out.preempted);
  const bool did_work = !out.empty();
  if (did_work) {
    sparsity_.plan_rows(out, samples_);
    runner_.copy_pages(out);
    speculative_.draft(out, samples_);
    const std::vector<float>& logits = run_model(out);
    scheduler_.on_step_done(out);
    process_outputs(out, logits);
    sparsity_.after_step(samples_);
    ++num_steps_;
  }
  forget_evicted_parked();
  publish_stats();
  return did_work;
}

EngineStats Engine::make_stats() const {
  SpeculativeStats spec = speculative_.stats();
  return {.num_running = scheduler_.stats().num_running,
          .num_waiting = scheduler_.stats().num_waiting,
          .num_preemptions = scheduler_.stats().num_preemptions,
          .num_steps = num_steps_,
          .num_prompt_tokens_computed = outputs_.num_prompt_tokens_computed(),
          .num_generated_tokens = outputs_.num_generated_tokens(),
          .spec_num_drafts = spec.num_drafts,
          .spec_num_draft_tokens = spec.num_draft_tokens,
          .spec_num_accepted_tokens = spec.num_accepted_tokens,
          .spec_accepted_per_position = std::move(spec.accepted_per_position),
          .num_continued_requests = num_continued_requests_,
          .num_continued_tokens = num_continued_tokens_,
          .kv = kv_.stats(),
          .kv_bytes_per_page = kv_bytes_per_page_,
          .draft_kv = spec.draft_kv,
          .draft_kv_bytes_per_page = spec.draft_kv_bytes_per_page};
}

void Engine::publish_stats() {
  EngineStats stats = make_stats();
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
        return stop_requested_ || !pending_.empty() || !cancelled_.empty() ||
               !prefix_cache_resets_.empty() || snapshots_.asked();
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
  serve_prefix_cache_resets();
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
