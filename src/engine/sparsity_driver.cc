#include "engine/sparsity_driver.h"

#include <algorithm>
#include <span>
#include <string>
#include <utility>

#include "util/error.h"

namespace sieve::engine {

namespace {

// FastGen's token classes, from the engine's tokenizer (not hard-coded ids).
sparsity::TokenClass token_class(const tok::Tokenizer& tokenizer, TokenId token) {
  if (tokenizer.is_special(token)) return sparsity::TokenClass::kSpecial;
  if (tokenizer.is_punctuation(token)) return sparsity::TokenClass::kPunctuation;
  return sparsity::TokenClass::kOther;
}

// The step's chunk of a sparse sequence ends where its prompt is compressed: on a chunk
// boundary, or at the prompt's end (the step samples). plan_rows asks such a chunk for its
// window's scores; on_prefill_chunk and on_prompt_done queue the compression.
bool ends_where_compressed(const sched::ScheduledSequence& scheduled, const Sample& sample) {
  if (!sample.sparsity || sample.sparsity->prompt_compressed()) return false;
  const int32_t computed = scheduled.num_computed_before + scheduled.num_new_tokens;
  const int32_t boundary = sample.chunk_boundary;
  return scheduled.samples || (boundary > 0 && computed % boundary == 0);
}

}  // namespace

sparsity::PolicySpec SparsityDriver::with_model_window(sparsity::PolicySpec policy) const {
  // The attention kernels mask by the window either way.
  if (const std::optional<int64_t> window = model_.sliding_window;
      window && std::holds_alternative<sparsity::FullSpec>(policy.policy)) {
    policy.policy = sparsity::StreamingSpec{.num_sinks = 0, .window = *window};
  }
  return policy;
}

std::variant<SparseAdmission, AdmissionError> SparsityDriver::admit(
    const sparsity::PolicySpec& policy, int64_t prompt_tokens, int64_t max_new_tokens,
    int32_t n) const {
  const int32_t page_size = config_.page_size;
  SparseAdmission admission{.pages_needed =
                                (prompt_tokens + max_new_tokens + page_size - 1) / page_size};
  if (std::holds_alternative<sparsity::FullSpec>(policy.policy)) return admission;
  try {
    admission.controller = std::make_unique<sparsity::SparsityController>(resolve(policy));
  } catch (const Error& e) {
    return AdmissionError::invalid("kv_policy", e.what());
  }
  const sparsity::SparsityController& controller = *admission.controller;
  if (controller.is_dense()) {
    admission.controller.reset();
    return admission;
  }
  const std::vector<std::optional<int64_t>> bounds =
      controller.max_kept_tokens(prompt_tokens, max_new_tokens);
  const bool bounded =
      std::any_of(bounds.begin(), bounds.end(), [](const auto& b) { return b.has_value(); });
  if (bounded && config_.sparse_prefill_chunk > 0) {
    // The observation window must lie inside the chunk it scores, and chunks end on pages
    // (a prefix-cache hit is capped at the first one).
    const int32_t chunk = std::max(config_.sparse_prefill_chunk, controller.observation_rows());
    admission.chunk_boundary = (chunk + page_size - 1) / page_size * page_size;
  }
  const int64_t first_chunk = admission.chunk_boundary > 0
                                  ? std::min<int64_t>(prompt_tokens, admission.chunk_boundary)
                                  : prompt_tokens;
  admission.private_kv = admission.chunk_boundary == 0 && n <= 1;
  admission.pages_needed =
      kv::sparse_peak_pages({.shape = kv_.slice_shape(),
                             .max_kept_tokens = bounds,
                             .chunk_size = first_chunk,
                             .max_total_tokens = prompt_tokens + max_new_tokens,
                             .dense_tokens_at_first_compression = first_chunk,
                             .in_place = admission.private_kv});
  return admission;
}

sparsity::SparsityPlan SparsityDriver::resolve(const sparsity::PolicySpec& policy) const {
  const sparsity::ModelShape shape{.num_layers = model_.num_layers,
                                   .num_kv_heads = model_.num_kv_heads};
  try {
    return sparsity::resolve(policy, shape, config_.calibration.get());
  } catch (const Error& e) {
    if (config_.calibration) fail("kv_policy '{}': {}", sparsity::to_string(policy), e.what());
    // Would any profile do? Then the missing one is the problem.
    const sparsity::CalibrationProfile any{
        .model_name = "any",
        .model_fingerprint = "any",
        .num_layers = model_.num_layers,
        .num_kv_heads = model_.num_kv_heads,
        .streaming_scores =
            std::vector<double>(static_cast<size_t>(model_.num_layers * model_.num_kv_heads), 0.5)};
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

// Sequences whose prompt was compressed: their controllers say which slices each stream's decode
// row reads (Quest) and which streams return attention weights (H2O, FastGen's frequent set).
void SparsityDriver::plan_rows(const sched::ScheduleOutput& out, const Samples& samples) {
  row_requests_.clear();
  for (const sched::ScheduledSequence& scheduled : out.scheduled) {
    const Sample& sample = *samples.at(scheduled.seq_id);
    if (!sample.sparsity) continue;
    if (!sample.sparsity->prompt_compressed()) {
      // A prompt chunk after which the prompt is compressed: its last rows score the keys in
      // this step, instead of compress() running them again.
      const int32_t window = sample.sparsity->observation_rows();
      if (ends_where_compressed(scheduled, sample) && window > 0 &&
          window <= scheduled.num_new_tokens && scheduled.num_draft_tokens == 0)
        row_requests_.emplace(scheduled.seq_id, ModelRunner::RowRequests{.observe_rows = window});
      continue;
    }
    if (!scheduled.stream_slots) continue;
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

const ModelRunner::RowRequests* SparsityDriver::row_requests(sched::SeqId seq) const {
  auto it = row_requests_.find(seq);
  return it == row_requests_.end() ? nullptr : &it->second;
}

void SparsityDriver::on_prefill_chunk(const sched::ScheduledSequence& scheduled,
                                      const Sample& sample) {
  // A prefill chunk of a sparse request ended on a boundary: compress before the next one.
  if (ends_where_compressed(scheduled, sample)) to_compress_.push_back(scheduled.seq_id);
}

void SparsityDriver::on_prompt_done(sched::SeqId seq, const Sample& sample) {
  if (sample.sparsity && !sample.sparsity->prompt_compressed()) to_compress_.push_back(seq);
}

void SparsityDriver::on_preempted(Sample& sample) {
  if (sample.sparsity && sample.sparsity->compressed_through() > 0) sample.sparsity->restart();
}

void SparsityDriver::after_step(Samples& samples) {
  std::vector<sched::SeqId> pending;
  pending.swap(to_compress_);
  for (sched::SeqId seq : pending) {
    // A retry (compaction found no free page last step) may since have been preempted: its KV
    // is gone and its recompute compresses again at its boundaries.
    if (!kv_.contains(seq)) continue;
    auto it = samples.find(seq);
    if (it != samples.end() && !it->second->sparsity->prompt_compressed())
      compress(seq, *it->second);
  }
  for (auto& [seq, sample] : samples) {
    if (sample->sparsity && sample->sparsity->acts_on_decode()) drop_out_of_window(seq, *sample);
  }
  for (sched::SeqId seq : extended_) {
    auto it = samples.find(seq);
    if (it != samples.end() && it->second->sparsity) it->second->sparsity->begin_prompt();
  }
  extended_.clear();
}

void SparsityDriver::settle(sched::SeqId seq, Sample& sample) {
  if (!sample.sparsity) return;
  if (auto it = std::find(to_compress_.begin(), to_compress_.end(), seq);
      it != to_compress_.end()) {
    to_compress_.erase(it);
    if (!sample.sparsity->prompt_compressed()) compress(seq, sample);
    // No page for the compaction: it stays queued (compress() queued it again), for a sequence
    // that is gone; a continuation would compress on its own next boundary.
    std::erase(to_compress_, seq);
  }
  if (sample.sparsity->acts_on_decode()) drop_out_of_window(seq, sample);
}

// At each chunk boundary of the prompt (chunk_boundary) and right after the step that computed
// the whole prompt (and sampled the first token from the cache as it was), every stream keeps
// what its policy selects among its current keys: those kept so far, then the new chunk. The
// prompt's last compression also starts the decode-time policies.
void SparsityDriver::compress(sched::SeqId seq, Sample& sample) {
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
    // Scored in the step that computed the window (plan_rows), or now by running it again.
    const ModelRunner::ObservationScores* in_step = runner_.observed(seq, n, rows);
    const ModelRunner::ObservationScores& observed =
        in_step ? *in_step : runner_.observe(seq, scheduler_.tokens(seq).first(n), rows);
    for (size_t s = 0; s < num_keys.size(); ++s) scores.push_back(observed.stream(s));
  }
  std::vector<std::span<const float>> keys;
  if (controller.needs_keys()) {  // key-similarity policies (keydiff) score the keys themselves
    const ModelRunner::ObservationScores& read = runner_.read_keys(seq, n);
    for (size_t s = 0; s < num_keys.size(); ++s) keys.push_back(read.stream(s));
  }
  std::vector<sparsity::TokenClass> classes;
  if (last && controller.needs_token_classes()) {
    for (int32_t i = 0; i < n; ++i)
      classes.push_back(token_class(tokenizer_, scheduler_.tokens(seq)[i]));
  }
  sparsity::SparsityController::Compression compression =
      controller.propose({.prompt_done = last,
                          .num_positions = n,
                          .num_keys = num_keys,
                          .scores = scores,
                          .classes = classes,
                          .keys = keys,
                          .head_dim = static_cast<int32_t>(model_.head_dim)});
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
void SparsityDriver::drop_out_of_window(sched::SeqId seq, Sample& sample) {
  if (!kv_.is_sparse(seq)) return;
  const kv::SparseLayout& layout = kv_.sparse_layout(seq);
  const std::vector<int32_t> num_keys = kv_.stream_lengths(seq, layout.num_positions);
  const model::StreamOutputs* outputs = runner_.outputs(seq);
  const int32_t new_position = layout.num_positions - 1;
  const sparsity::TokenClass new_class =
      sample.sparsity->needs_token_classes()
          ? token_class(tokenizer_, scheduler_.tokens(seq)[new_position])
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

}  // namespace sieve::engine
