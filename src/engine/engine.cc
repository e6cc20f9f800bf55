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

// FastGen's token classes, from the engine's tokenizer (not hard-coded ids).
sparsity::TokenClass token_class(const tok::Tokenizer& tokenizer, TokenId token) {
  if (tokenizer.is_special(token)) return sparsity::TokenClass::kSpecial;
  if (tokenizer.is_punctuation(token)) return sparsity::TokenClass::kPunctuation;
  return sparsity::TokenClass::kOther;
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

// A sparse request's admission terms, shared by its samples.
struct SparseAdmission {
  // Prefill is compressed at every multiple of this many positions (0: only at its end), so
  // the prompt never holds more than the policy's budget + one chunk.
  int32_t chunk_boundary = 0;
  // Keeps its pages out of the prefix cache so that its one compression, of the whole prompt,
  // adopts them in place instead of copying them (no chunks, n = 1). A chunked request shares
  // prefixes like any other: leaving the cached pages copies one chunk at most.
  bool private_kv = false;
};

struct Engine::PendingRequest {
  RequestId id = 0;
  Request request;
  std::unique_ptr<sparsity::SparsityController> sparsity;  // null: dense
  SparseAdmission admission;
  std::optional<int64_t> max_pages;  // sparse admission bound
  std::string policy_name;           // canonical kv_policy, for KV snapshots
  spec::SpeculativeConfig speculative;
  std::shared_ptr<EventSink> sink;
  Clock::time_point arrival;
};

// One sequence: one sample of one request.
struct Engine::Sample {
  RequestId request_id = 0;
  int32_t sample_idx = 0;
  std::shared_ptr<EventSink> sink;
  SamplingParams params;
  Sampler sampler;
  StopMatcher stop;
  int32_t num_prompt_tokens = 0;
  int32_t num_samples_to_fork = 0;  // n - 1 on the first sample until its first token
  Clock::time_point arrival;
  std::optional<Clock::time_point> first_scheduled;
  int32_t cached_prompt_tokens = 0;
  Timings timings;
  std::unique_ptr<sparsity::SparsityController> sparsity;  // null: dense
  // For KV snapshots only: the request's label and canonical kv_policy (shared by its samples).
  std::shared_ptr<const RequestLabel> label;
  std::shared_ptr<const std::string> policy_name;
  int32_t chunk_boundary = 0;                     // SparseAdmission's
  std::optional<float> attention_recovery;        // from the compression
  spec::SpeculativeConfig speculative;            // the request's, or the server's
  std::optional<spec::DraftLength> draft_length;  // speculative.adaptive: this sequence's k
  int32_t spec_draft_tokens = 0;
  int32_t spec_accepted_tokens = 0;
  // Prompt logprobs (Request::prompt_logprobs): the top N per row; the prompt tokens' entries so
  // far ([0]: the first token's, without logprob), until the prompt is done; then the result the
  // sample's first event carries (moved out when sent).
  std::optional<int32_t> prompt_logprobs;
  std::vector<SampleResult> prompt_rows;
  std::shared_ptr<const std::vector<SampleResult>> unsent_prompt_logprobs;

  Sample(RequestId request, int32_t idx, std::shared_ptr<EventSink> event_sink,
         const SamplingParams& p, std::span<const TokenId> eos, int32_t prompt_tokens,
         Clock::time_point arrived)
      : request_id(request),
        sample_idx(idx),
        sink(std::move(event_sink)),
        params(p),
        sampler(p, eos),
        stop(p, eos),
        num_prompt_tokens(prompt_tokens),
        arrival(arrived) {}
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
      scheduler_(sched::SchedulerConfig{.max_batch_tokens = config.max_batch_tokens,
                                        .max_num_seqs = config.max_num_seqs,
                                        .max_model_len =
                                            static_cast<int32_t>(model_->config().context_length)},
                 kv_),
      runner_(*model_, cache_, kv_) {
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
  kv_bytes_per_page_ = static_cast<int64_t>(
      model::KvCache::bytes_per_page(model_->config(), config.page_size, config.kv_dtype));
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
  // A sliding-window model (Mistral 7B v0.1) never attends to keys older than its window, so a
  // dense request keeps just the window (sink-free streaming): the pages of older keys go back to
  // the pool as it runs. The attention kernels mask by the window either way.
  if (const std::optional<int64_t> window = model_->config().sliding_window;
      window && std::holds_alternative<sparsity::FullSpec>(request.kv_policy.policy)) {
    request.kv_policy.policy = sparsity::StreamingSpec{.num_sinks = 0, .window = *window};
  }
  std::unique_ptr<sparsity::SparsityController> sparsity;
  SparseAdmission admission;
  int64_t pages_needed =
      (prompt_len + *request.params.max_tokens + config_.page_size - 1) / config_.page_size;
  if (!std::holds_alternative<sparsity::FullSpec>(request.kv_policy.policy)) {
    try {
      sparsity = std::make_unique<sparsity::SparsityController>(resolve_policy(request.kv_policy));
    } catch (const Error& e) {
      return AdmissionError::invalid("kv_policy", e.what());
    }
    if (sparsity->is_dense()) {
      sparsity.reset();
    } else {
      const std::vector<std::optional<int64_t>> bounds =
          sparsity->max_kept_tokens(prompt_len, *request.params.max_tokens);
      const bool bounded =
          std::any_of(bounds.begin(), bounds.end(), [](const auto& b) { return b.has_value(); });
      if (bounded && config_.sparse_prefill_chunk > 0) {
        // The observation window must lie inside the chunk it scores, and chunks end on pages
        // (a prefix-cache hit is capped at the first one).
        const int32_t chunk = std::max(config_.sparse_prefill_chunk, sparsity->observation_rows());
        admission.chunk_boundary =
            (chunk + config_.page_size - 1) / config_.page_size * config_.page_size;
      }
      const int64_t first_chunk = admission.chunk_boundary > 0
                                      ? std::min<int64_t>(prompt_len, admission.chunk_boundary)
                                      : prompt_len;
      admission.private_kv = admission.chunk_boundary == 0 && request.params.n <= 1;
      pages_needed =
          kv::sparse_peak_pages({.shape = kv_.slice_shape(),
                                 .max_kept_tokens = bounds,
                                 .chunk_size = first_chunk,
                                 .max_total_tokens = prompt_len + *request.params.max_tokens,
                                 .dense_tokens_at_first_compression = first_chunk,
                                 .in_place = admission.private_kv});
    }
  }
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
  pending->sparsity = std::move(sparsity);
  pending->admission = admission;
  pending->speculative = std::move(speculative);
  pending->policy_name = sparsity::to_string(pending->request.kv_policy);  // off the engine thread
  if (pending->sparsity) pending->max_pages = pages_needed;
  const RequestId id = pending->id;
  pending_.push_back(std::move(pending));
  work_available_.notify_one();
  return id;
}

// The request's plan, with the server's calibration profile. A policy that needs a profile when
// the server has none is refused naming --calibration.
sparsity::SparsityPlan Engine::resolve_policy(const sparsity::PolicySpec& policy) const {
  const model::ModelConfig& mc = model_->config();
  const sparsity::ModelShape shape{.num_layers = mc.num_layers, .num_kv_heads = mc.num_kv_heads};
  try {
    return sparsity::resolve(policy, shape, config_.calibration.get());
  } catch (const Error& e) {
    if (config_.calibration) fail("kv_policy '{}': {}", sparsity::to_string(policy), e.what());
    // Would any profile do? Then the missing one is the problem.
    const sparsity::CalibrationProfile any{
        .model_name = "any",
        .model_fingerprint = "any",
        .num_layers = mc.num_layers,
        .num_kv_heads = mc.num_kv_heads,
        .streaming_scores =
            std::vector<double>(static_cast<size_t>(mc.num_layers * mc.num_kv_heads), 0.5)};
    try {
      sparsity::resolve(policy, shape, &any);
    } catch (const Error&) {
      fail("kv_policy '{}': {}", sparsity::to_string(policy), e.what());
    }
    fail(
        "kv_policy '{}' needs a calibration profile of the model's heads, and this server has "
        "none: start it "
        "with --calibration FILE (written by `sieve calibrate`)",
        sparsity::to_string(policy));
  }
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
    sample->sparsity = std::move(p->sparsity);
    sample->label = std::make_shared<const RequestLabel>(std::move(p->request.label));
    sample->policy_name = std::make_shared<const std::string>(std::move(p->policy_name));
    sample->chunk_boundary = p->admission.chunk_boundary;
    sample->speculative = p->speculative;
    if (p->speculative.adaptive)
      sample->draft_length.emplace(p->speculative.num_speculative_tokens);
    sample->prompt_logprobs = p->request.prompt_logprobs;
    if (sample->prompt_logprobs) sample->prompt_rows.push_back({.token = p->request.prompt[0]});
    const int32_t max_new = *p->request.params.max_tokens;
    scheduler_.add(seq, std::move(p->request.prompt), max_new,
                   {.max_pages = p->max_pages,
                    .chunk_boundary = p->admission.chunk_boundary,
                    .private_kv = p->admission.private_kv,
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

void Engine::finish_sample(sched::SeqId seq, RequestEvent& event) {
  Sample& sample = *samples_.at(seq);
  const auto now = Clock::now();
  sample.timings.total_seconds = seconds_between(sample.arrival, now);
  const int64_t num_tokens = static_cast<int64_t>(scheduler_.tokens(seq).size());
  const int32_t kv_pages = kv_.num_pages_held(seq);
  const auto kv_dense_pages =
      static_cast<int32_t>((num_tokens - 1 + config_.page_size - 1) / config_.page_size);
  event.usage = {.prompt_tokens = sample.num_prompt_tokens,
                 .completion_tokens = scheduler_.num_output_tokens(seq),
                 .cached_prompt_tokens = sample.cached_prompt_tokens,
                 .kv_pages = kv_pages,
                 .kv_dense_pages = kv_dense_pages,
                 .kv_bytes = kv_pages * kv_bytes_per_page_,
                 .kv_dense_bytes = kv_dense_pages * kv_bytes_per_page_,
                 .attention_recovery = sample.attention_recovery,
                 .spec_draft_tokens = sample.spec_draft_tokens,
                 .spec_accepted_tokens = sample.spec_accepted_tokens};
  if (draft_) {
    event.usage.spec_draft_kv_pages = draft_->num_pages_held(seq);
    event.usage.spec_draft_kv_bytes = event.usage.spec_draft_kv_pages * draft_->kv_bytes_per_page();
  }
  event.timings = std::move(sample.timings);
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

// For each scheduled sequence: timings and prompt accounting; a prefill chunk that ended on a
// chunk boundary is marked for compression; a sampling row gives each of the request's samples
// its token: sample → stop → event.
void Engine::process_outputs(const sched::ScheduleOutput& out, const std::vector<float>& logits) {
  const int64_t vocab = model_->config().vocab_size;
  const auto now = Clock::now();
  int64_t row = 0;
  for (const sched::ScheduledSequence& scheduled : out.scheduled) {
    Sample& first = *samples_.at(scheduled.seq_id);
    if (!first.first_scheduled) {
      first.first_scheduled = now;
      first.timings.queue_seconds = seconds_between(first.arrival, now);
      first.cached_prompt_tokens = scheduled.num_computed_before;
    }
    if (scheduled.num_computed_before < first.num_prompt_tokens) {
      num_prompt_tokens_computed_ += std::min(
          scheduled.num_new_tokens, first.num_prompt_tokens - scheduled.num_computed_before);
    }
    if (scheduled.num_prompt_logits > 0) {
      const int64_t num_rows = scheduled.num_prompt_logits;
      record_prompt_logprobs(
          scheduled, first,
          std::span<const float>(&logits[row * vocab], static_cast<size_t>(num_rows * vocab)));
      row += num_rows;
    }
    if (!scheduled.samples) {
      // A prefill chunk of a sparse request ended on a boundary: compress before the next one.
      const int32_t computed = scheduled.num_computed_before + scheduled.num_new_tokens;
      const int32_t boundary = first.chunk_boundary;
      if (boundary > 0 && computed % boundary == 0 && !first.sparsity->prompt_compressed())
        to_compress_.push_back(scheduled.seq_id);
      continue;
    }
    const int32_t num_rows = scheduled.num_draft_tokens + 1;
    std::span<const float> rows(&logits[row * vocab], static_cast<size_t>(num_rows * vocab));
    row += num_rows;
    if (!first.prompt_rows.empty()) {  // the prompt is done: its logprobs go with first events
      first.unsent_prompt_logprobs =
          std::make_shared<const std::vector<SampleResult>>(std::exchange(first.prompt_rows, {}));
    }

    // n > 1: the other samples start here, sharing every prompt page, from the same logits (a
    // sequence that forks has no draft).
    const std::vector<sched::SeqId> seqs = first.num_samples_to_fork > 0
                                               ? fork_samples(scheduled.seq_id, first)
                                               : std::vector<sched::SeqId>{scheduled.seq_id};
    for (sched::SeqId seq : seqs) {
      Sample& sample = *samples_.at(seq);
      if (sample.params.max_tokens == 0) {
        finish_unsampled(seq, sample);
        continue;
      }
      if (sample.sparsity && !sample.sparsity->prompt_compressed()) to_compress_.push_back(seq);
      std::vector<SampleResult> results =
          verify_draft(seq, sample, rows, scheduled.num_draft_tokens);
      emit_tokens(seq, sample, results, scheduled.num_draft_tokens, now);
    }
  }
}

void Engine::record_prompt_logprobs(const sched::ScheduledSequence& scheduled, Sample& sample,
                                    std::span<const float> rows) {
  const auto vocab = static_cast<size_t>(model_->config().vocab_size);
  std::span<const int32_t> tokens = scheduler_.tokens(scheduled.seq_id);
  const auto first = static_cast<size_t>(scheduled.num_computed_before);
  // Chunks come in order and never from the prefix cache; a recompute after preemption starts
  // again from position 0.
  assert(sample.prompt_rows.size() >= first + 1);
  sample.prompt_rows.resize(first + 1);
  for (size_t i = 0; i < static_cast<size_t>(scheduled.num_prompt_logits); ++i) {
    const std::span<const float> row = rows.subspan(i * vocab, vocab);
    const TokenId next = tokens[first + i + 1];
    SampleResult result{.token = next, .top = top_logprobs(row, *sample.prompt_logprobs)};
    // One log-sum-exp pass per row (O(V) exps, the reduction's main cost): the top list's first
    // entry gives it back (lse = its logit - its logprob).
    result.logprob = result.top.empty()
                         ? static_cast<float>(token_logprob(row, next))
                         : static_cast<float>(static_cast<double>(row[next]) -
                                              static_cast<double>(row[result.top[0].id]) +
                                              result.top[0].logprob);
    sample.prompt_rows.push_back(std::move(result));
  }
}

void Engine::finish_unsampled(sched::SeqId seq, Sample& sample) {
  RequestEvent event{.request_id = sample.request_id,
                     .sample_idx = sample.sample_idx,
                     .prompt_logprobs = std::move(sample.unsent_prompt_logprobs),
                     .finish = sample.stop.finish(FinishReason::kLength).finish};
  finish_sample(seq, event);
  (*sample.sink)(event);
  samples_.erase(seq);
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
  RequestEvent event{.request_id = sample.request_id,
                     .sample_idx = sample.sample_idx,
                     .prompt_logprobs = std::move(sample.unsent_prompt_logprobs)};
  // The stop matcher sees the tokens one by one, as without a draft; a stop inside the accepted
  // drafts ends the sample there.
  int32_t num_emitted = 0;
  for (SampleResult& result : results) {
    ++num_emitted;
    event.tokens.push_back(result.token);
    StopUpdate update = sample.stop.push(result.token, tokenizer_->token_to_piece(result.token));
    if (!update.finish && num_known + num_emitted >= model_->config().context_length) {
      StopUpdate rest = sample.stop.finish(FinishReason::kLength);
      update.text += rest.text;
      update.finish = rest.finish;
    }
    event.text += update.text;
    if (sample.params.logprobs) event.logprobs.push_back(std::move(result));
    sample.timings.token_seconds.push_back(seconds_between(sample.arrival, now));
    if (update.finish) {
      event.finish = update.finish;
      break;
    }
  }
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
  num_generated_tokens_ += num_emitted;
  sample.timings.first_token_seconds = sample.timings.token_seconds.front();
  if (event.finish) finish_sample(seq, event);
  (*sample.sink)(event);
  if (event.finish) samples_.erase(seq);
}

// A preempted sequence is recomputed from its tokens as a dense one: compress again when that is
// done. Its draft model pages go back too (it drafts again once it decodes), and the runner's
// key summaries (Quest's, a Quest draft view's), which describe K about to be recomputed.
void Engine::restart_preempted(const std::vector<sched::SeqId>& preempted) {
  for (sched::SeqId seq : preempted) {
    if (draft_) draft_->release(seq);
    runner_.forget(seq);
    if (auto it = samples_.find(seq); it != samples_.end() && it->second->sparsity &&
                                      it->second->sparsity->compressed_through() > 0) {
      it->second->sparsity->restart();
    }
  }
}

// Sequences whose prompt was compressed: their controllers say which slices each stream's decode
// row reads (Quest) and which streams return attention weights (H2O, FastGen's frequent set).
void Engine::plan_row_requests(const sched::ScheduleOutput& out) {
  row_requests_.clear();
  for (const sched::ScheduledSequence& scheduled : out.scheduled) {
    const Sample& sample = *samples_.at(scheduled.seq_id);
    if (!sample.sparsity || !sample.sparsity->prompt_compressed() || !scheduled.stream_slots)
      continue;
    const sparsity::SparsityController& controller = *sample.sparsity;
    ModelRunner::RowRequests requests{.want_attention = controller.decode_attention_streams()};
    if (controller.selects_pages()) {
      const std::vector<int32_t> num_keys = kv_.stream_lengths(
          scheduled.seq_id, scheduled.num_computed_before + scheduled.num_new_tokens);
      requests.page_reads = controller.decode_reads(num_keys, config_.page_size);
    }
    if (requests.want_attention.empty() && requests.page_reads.empty()) continue;
    row_requests_.emplace(scheduled.seq_id, std::move(requests));
  }
}

bool Engine::step() {
  // Admit first, so that a request cancelled before its first step is found and stopped.
  admit();
  apply_cancellations();
  // Between steps, finished and cancelled sequences gone: a consistent view for snapshots.
  if (snapshot_asked_.load(std::memory_order_relaxed)) serve_kv_snapshots();
  propose_drafts();
  sched::ScheduleOutput out = scheduler_.schedule();
  restart_preempted(out.preempted);
  const bool did_work = !out.empty();
  if (did_work) {
    plan_row_requests(out);
    runner_.copy_pages(out);
    draft_self_sparse(out);
    prefill_draft_model(out);
    const auto run_start = Clock::now();
    const std::vector<float>& logits = runner_.run(
        out, [&](sched::SeqId seq) { return scheduler_.tokens(seq); },
        [&](sched::SeqId seq) -> const ModelRunner::RowRequests* {
          auto it = row_requests_.find(seq);
          return it == row_requests_.end() ? nullptr : &it->second;
        });
    record_step_cost(out, seconds_between(run_start, Clock::now()));
    scheduler_.on_step_done(out);
    process_outputs(out, logits);
    apply_sparsity();
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
                    .num_prompt_tokens_computed = num_prompt_tokens_computed_,
                    .num_generated_tokens = num_generated_tokens_,
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
  // Built outside the lock: only this thread changes what it reads.
  std::shared_ptr<const KvSnapshot> snapshot;
  if (watched_.load(std::memory_order_relaxed))
    snapshot = std::make_shared<const KvSnapshot>(make_kv_snapshot());
  std::lock_guard lock(mutex_);
  published_stats_ = stats;
  if (snapshot) {
    if (Clock::now() < watched_until_) {
      watched_snapshot_ = std::move(snapshot);
    } else {  // nobody polled for a while: stop publishing
      watched_.store(false, std::memory_order_relaxed);
      watched_snapshot_.reset();
    }
  }
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
               !snapshot_asks_.empty();
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
  serve_kv_snapshots();  // nothing steps now: answer what was asked meanwhile
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mutex_);
  return published_stats_;
}

void Engine::apply_sparsity() {
  std::vector<sched::SeqId> pending;
  pending.swap(to_compress_);
  for (sched::SeqId seq : pending) {
    // A retry (compaction found no free page last step) may since have been preempted: its KV
    // is gone and its recompute compresses again at its boundaries.
    if (!kv_.contains(seq)) continue;
    auto it = samples_.find(seq);
    if (it != samples_.end() && !it->second->sparsity->prompt_compressed())
      compress(seq, *it->second);
  }
  for (auto& [seq, sample] : samples_) {
    if (sample->sparsity && sample->sparsity->acts_on_decode()) drop_out_of_window(seq, *sample);
  }
}

// At each chunk boundary of the prompt (chunk_boundary) and right after the step that computed
// the whole prompt (and sampled the first token from the cache as it was), every stream keeps
// what its policy selects among its current keys: those kept so far, then the new chunk. The
// prompt's last compression also starts the decode-time policies.
void Engine::compress(sched::SeqId seq, Sample& sample) {
  sparsity::SparsityController& controller = *sample.sparsity;
  const bool last = scheduler_.num_output_tokens(seq) > 0;
  const int32_t n = scheduler_.num_computed(seq);  // the sampled token is not computed yet
  const bool sparse = kv_.is_sparse(seq);
  // (Again) from the start: a recompute after preemption, a child that waited.
  if (!sparse) controller.restart();
  if (n <= controller.compressed_through() && !last) return;
  const std::vector<int32_t> num_keys = kv_.stream_lengths(seq, n);
  std::vector<std::span<const float>> scores;
  if (const int32_t rows = controller.observation_rows(); rows > 0) {
    const ModelRunner::ObservationScores& observed =
        runner_.observe(seq, scheduler_.tokens(seq).first(n), rows);
    for (size_t s = 0; s < num_keys.size(); ++s) scores.push_back(observed.stream(s));
  }
  std::vector<std::span<const float>> keys;
  if (controller.needs_keys()) {
    const ModelRunner::ObservationScores& read = runner_.read_keys(seq, n);
    for (size_t s = 0; s < num_keys.size(); ++s) keys.push_back(read.stream(s));
  }
  std::vector<sparsity::TokenClass> classes;
  if (last && controller.needs_token_classes()) {
    for (int32_t i = 0; i < n; ++i)
      classes.push_back(token_class(*tokenizer_, scheduler_.tokens(seq)[i]));
  }
  sparsity::SparsityController::Compression compression =
      controller.propose({.prompt_done = last,
                          .num_positions = n,
                          .num_keys = num_keys,
                          .scores = scores,
                          .classes = classes,
                          .keys = keys,
                          .head_dim = static_cast<int32_t>(model_->config().head_dim)});
  if (compression.attention_recovery) sample.attention_recovery = compression.attention_recovery;
  if (compression.changes_layout) {
    std::optional<kv::CompactionPlan> plan = kv_.compress(seq, n, compression.keep);
    if (!plan) {  // no free page for the copy out of shared pages: stay dense, try next step
      to_compress_.push_back(seq);
      return;
    }
    runner_.apply(*plan);
  }
  controller.commit(std::move(compression));
}

// After a decode step, each stream drops what its policy lets go (sink + window: the key that
// left the window; H2O: the lowest accumulated; FastGen: what its choice no longer keeps), and
// learns what the step's rows handed back (attention weights, Quest's slice choices).
void Engine::drop_out_of_window(sched::SeqId seq, Sample& sample) {
  if (!kv_.is_sparse(seq)) return;
  const kv::SparseLayout& layout = kv_.sparse_layout(seq);
  const std::vector<int32_t> num_keys = kv_.stream_lengths(seq, layout.num_positions);
  const model::StreamOutputs* outputs = runner_.outputs(seq);
  const int32_t new_position = layout.num_positions - 1;
  const sparsity::TokenClass new_class =
      sample.sparsity->needs_token_classes()
          ? token_class(*tokenizer_, scheduler_.tokens(seq)[new_position])
          : sparsity::TokenClass::kOther;
  kv::DropSets drops = sample.sparsity->after_decode_step(
      layout.num_positions, num_keys,
      outputs ? std::span<const std::vector<float>>(outputs->attention)
              : std::span<const std::vector<float>>(),
      outputs ? std::span<const std::vector<int32_t>>(outputs->chosen_slices)
              : std::span<const std::vector<int32_t>>(),
      new_class);
  if (std::any_of(drops.begin(), drops.end(), [](const auto& d) { return !d.empty(); }))
    runner_.apply(kv_.drop_tokens(seq, drops));
}

// --- KV snapshots (engine/kv_snapshot.h) ---------------------------------------------------

std::string_view phase_name(SequencePhase phase) {
  switch (phase) {
    case SequencePhase::kWaiting:
      return "waiting";
    case SequencePhase::kPreempted:
      return "preempted";
    case SequencePhase::kPrefill:
      return "prefill";
    case SequencePhase::kDecode:
      return "decode";
  }
  return "?";
}

void Engine::request_kv_snapshot(KvSnapshotQuery query, KvSnapshotSink done) {
  std::shared_ptr<const KvSnapshot> published;
  {
    std::lock_guard lock(mutex_);
    if (!query.label_id) {  // an overview: a dashboard polling keeps the engine publishing
      const auto now = Clock::now();
      if (watched_.load(std::memory_order_relaxed) && now < watched_until_)
        published = watched_snapshot_;
      watched_until_ = now + kSnapshotWatchWindow;
      watched_.store(true, std::memory_order_relaxed);
    }
    if (!published) {
      snapshot_asks_.push_back({.query = std::move(query), .done = std::move(done)});
      snapshot_asked_.store(true, std::memory_order_relaxed);
      work_available_.notify_one();
      return;
    }
  }
  done(*published);
}

void Engine::serve_kv_snapshots() {
  std::vector<SnapshotAsk> asks;
  {
    std::lock_guard lock(mutex_);
    asks.swap(snapshot_asks_);
    snapshot_asked_.store(false, std::memory_order_relaxed);
  }
  if (asks.empty()) return;
  // Dashboards polling together share one walk over the sequences.
  const KvSnapshot common = make_kv_snapshot();
  for (SnapshotAsk& ask : asks) {
    KvSnapshot snapshot = common;
    if (ask.query.label_id) snapshot.heads = kv_heads(ask.query);
    ask.done(std::move(snapshot));
  }
}

// O(sequences + pages held + pool pages): integers copied out of the pool, the scheduler and the
// samples; the pool walk counts cached-free pages, which nothing tracks on the hot path.
KvSnapshot Engine::make_kv_snapshot() const {
  const kv::PagePool& pool = kv_.pool();
  KvSnapshot snapshot{.taken_at = std::chrono::system_clock::now(),
                      .page_size = config_.page_size,
                      .bytes_per_page = kv_bytes_per_page_,
                      .kv_dtype = std::string(model::kv_dtype_name(config_.kv_dtype)),
                      .num_pages = kv_.num_pages(),
                      .num_pages_used = kv_.num_pages() - kv_.num_free_pages(),
                      .num_pages_free = kv_.num_free_pages(),
                      .num_pages_cached = pool.num_cached_pages(),
                      .num_running = scheduler_.stats().num_running,
                      .num_waiting = scheduler_.stats().num_waiting};
  for (int32_t p = 0; p < pool.num_pages(); ++p) {
    const kv::PageId page{p};
    if (pool.ref_count(page) == 0 && pool.block_hash(page)) ++snapshot.num_pages_cached_free;
  }
  std::vector<sched::SeqId> seqs;
  seqs.reserve(samples_.size());
  for (const auto& [seq, sample] : samples_) seqs.push_back(seq);
  std::sort(seqs.begin(), seqs.end());  // ids are handed out in admission order
  for (sched::SeqId seq : seqs) {
    const Sample& sample = *samples_.at(seq);
    KvSequenceSnapshot s{.label_id = sample.label->id,
                         .choice = sample.label->first_choice + sample.sample_idx,
                         .policy = *sample.policy_name,
                         .num_prompt_tokens = sample.num_prompt_tokens,
                         .num_generated_tokens = scheduler_.num_output_tokens(seq),
                         .num_computed_tokens = scheduler_.num_computed(seq),
                         .attention_recovery = sample.attention_recovery};
    s.num_context_tokens = s.num_prompt_tokens + s.num_generated_tokens;
    if (scheduler_.is_running(seq)) {
      s.phase = s.num_computed_tokens < s.num_prompt_tokens ? SequencePhase::kPrefill
                                                            : SequencePhase::kDecode;
    } else {
      s.phase = sample.first_scheduled ? SequencePhase::kPreempted : SequencePhase::kWaiting;
    }
    if (kv_.contains(seq)) {
      s.num_pages_held = kv_.num_pages_held(seq);
      s.compressed = kv_.is_sparse(seq);
      if (!s.compressed) {
        for (kv::PageId page : kv_.block_table(seq)) s.num_pages_shared += pool.ref_count(page) > 1;
      }
    }
    s.num_pages_dense = (s.num_computed_tokens + config_.page_size - 1) / config_.page_size;
    snapshot.sequences.push_back(std::move(s));
  }
  return snapshot;
}

std::optional<KvSnapshot::Heads> Engine::kv_heads(const KvSnapshotQuery& query) const {
  // The sequence asked about: that choice, or the lowest live choice of the label.
  const Sample* found = nullptr;
  sched::SeqId found_seq{0};
  for (const auto& [seq, sample] : samples_) {
    if (sample->label->id != *query.label_id) continue;
    const int32_t choice = sample->label->first_choice + sample->sample_idx;
    if (query.choice ? choice != *query.choice
                     : found && choice >= found->label->first_choice + found->sample_idx)
      continue;
    found = sample.get();
    found_seq = seq;
  }
  if (!found) return std::nullopt;
  const model::ModelConfig& mc = model_->config();
  KvSnapshot::Heads heads{.label_id = found->label->id,
                          .choice = found->label->first_choice + found->sample_idx,
                          .num_layers = static_cast<int32_t>(mc.num_layers),
                          .num_kv_heads = static_cast<int32_t>(mc.num_kv_heads)};
  const auto num_streams = static_cast<size_t>(heads.num_layers) * heads.num_kv_heads;
  heads.heads.assign(num_streams, KvHeadSnapshot{.kind = "full"});
  if (kv_.contains(found_seq)) {
    const std::vector<int32_t> lengths =
        kv_.is_sparse(found_seq)
            ? kv_.stream_lengths(found_seq, kv_.sparse_layout(found_seq).num_positions)
            : kv_.stream_lengths(found_seq, scheduler_.num_computed(found_seq));
    for (size_t s = 0; s < num_streams; ++s) heads.heads[s].num_tokens = lengths[s];
  }
  if (found->sparsity) {
    const std::vector<sparsity::SparsityController::StreamState> states = found->sparsity->report();
    for (size_t s = 0; s < num_streams; ++s) {
      heads.heads[s].kind = states[s].report.kind;
      heads.heads[s].num_pages_read = states[s].report.pages_read;
      heads.heads[s].recovery = states[s].recovery;
    }
  }
  return heads;
}

}  // namespace sieve::engine
