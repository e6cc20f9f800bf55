#include "engine/kv_snapshots.h"

#include <algorithm>
#include <string>
#include <utility>

#include "model/kv_cache.h"

namespace sieve::engine {

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

bool KvSnapshots::request(KvSnapshotQuery query, KvSnapshotSink done) {
  std::shared_ptr<const KvSnapshot> published;
  {
    std::lock_guard lock(mutex_);
    if (!query.label_id) {  // an overview: a dashboard polling keeps the engine publishing
      const auto now = Clock::now();
      if (watched_.load(std::memory_order_relaxed) && now < watched_until_)
        published = watched_snapshot_;
      watched_until_ = now + kWatchWindow;
      watched_.store(true, std::memory_order_relaxed);
    }
    if (!published) {
      asks_.push_back({.query = std::move(query), .done = std::move(done)});
      asked_.store(true, std::memory_order_relaxed);
      return true;
    }
  }
  done(*published);
  return false;
}

void KvSnapshots::serve() {
  std::vector<Ask> asks;
  {
    std::lock_guard lock(mutex_);
    asks.swap(asks_);
    asked_.store(false, std::memory_order_relaxed);
  }
  if (asks.empty()) return;
  // Dashboards polling together share one walk over the sequences.
  const KvSnapshot common = make();
  for (Ask& ask : asks) {
    KvSnapshot snapshot = common;
    if (ask.query.label_id) snapshot.heads = heads(ask.query, common.taken_at);
    ask.done(std::move(snapshot));
  }
}

// O(sequences + pages held + pool pages): integers copied out of the pool, the scheduler and the
// samples; the pool walk counts cached-free pages, which nothing tracks on the hot path.
// Built outside the lock: only the stepping thread changes what it reads.
void KvSnapshots::publish() {
  if (!watched_.load(std::memory_order_relaxed)) return;
  auto snapshot = std::make_shared<const KvSnapshot>(make());
  std::lock_guard lock(mutex_);
  if (Clock::now() < watched_until_) {
    watched_snapshot_ = std::move(snapshot);
  } else {  // nobody polled for a while: stop publishing
    watched_.store(false, std::memory_order_relaxed);
    watched_snapshot_.reset();
  }
}

std::vector<std::pair<int32_t, int32_t>> KvSnapshots::precise_heads() const {
  std::vector<std::pair<int32_t, int32_t>> heads;
  for (int32_t stream : shape_.precise_streams)
    heads.emplace_back(stream / shape_.num_kv_heads, stream % shape_.num_kv_heads);
  return heads;
}

KvSnapshot KvSnapshots::make() const {
  const kv::PagePool& pool = kv_.pool();
  // Pages only parked sequences hold count as free, as in the engine's stats (kv_manager.h).
  const kv::KvStats stats = kv_.stats();
  KvSnapshot snapshot{.taken_at = std::chrono::system_clock::now(),
                      .page_size = shape_.page_size,
                      .bytes_per_page = shape_.bytes_per_page,
                      .kv_dtype = std::string(model::kv_dtype_name(shape_.kv_dtype)),
                      .precise_heads = precise_heads(),
                      .num_pages = kv_.num_pages(),
                      .num_pages_used = stats.num_pages - stats.num_free_pages,
                      .num_pages_free = stats.num_free_pages,
                      .num_pages_parked = stats.num_parked_pages,
                      .num_parked_sequences = stats.num_parked_seqs,
                      .num_precise_spare_areas = stats.num_spare_areas,
                      .num_precise_spare_areas_free = stats.num_free_spare_areas,
                      .num_precise_copies_dropped = stats.num_dropped_f16_copies,
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
  for (sched::SeqId seq : seqs) snapshot.sequences.push_back(sequence(seq, *samples_.at(seq)));
  for (const Finished& f : finished_) {
    if (snapshot.taken_at - f.shown.finished_at > kFinishedWindow) break;  // the rest are older
    snapshot.finished.push_back(f.shown);
  }
  return snapshot;
}

KvSequenceSnapshot KvSnapshots::sequence(sched::SeqId seq, const Sample& sample) const {
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
    const kv::PagePool& pool = kv_.pool();
    s.num_pages_held = kv_.num_pages_held(seq);
    s.compressed = kv_.is_sparse(seq);
    if (!s.compressed) {
      for (kv::PageId page : kv_.block_table(seq)) s.num_pages_shared += pool.ref_count(page) > 1;
    }
  }
  s.num_pages_dense = (s.num_computed_tokens + shape_.page_size - 1) / shape_.page_size;
  return s;
}

void KvSnapshots::record_finished(sched::SeqId seq, const Sample& sample,
                                  std::string_view finish_reason) {
  Finished f{.shown = {.sequence = sequence(seq, sample),
                       .finish_reason = std::string(finish_reason),
                       .finished_at = std::chrono::system_clock::now()},
             .heads = heads_of(seq, sample)};
  f.heads.finish_reason = f.shown.finish_reason;
  finished_.push_front(std::move(f));
  if (finished_.size() > kMaxFinished) finished_.pop_back();
}

std::optional<KvSnapshot::Heads> KvSnapshots::heads(
    const KvSnapshotQuery& query, std::chrono::system_clock::time_point now) const {
  // The sequence asked about: that choice, or the lowest choice of the label; a live one first.
  const auto better = [&](const std::string& label_id, int32_t choice,
                          std::optional<int32_t> best) {
    if (label_id != *query.label_id) return false;
    return query.choice ? choice == *query.choice : !best || choice < *best;
  };
  const Sample* found = nullptr;
  sched::SeqId found_seq{0};
  std::optional<int32_t> best;
  for (const auto& [seq, sample] : samples_) {
    const int32_t choice = sample->label->first_choice + sample->sample_idx;
    if (!better(sample->label->id, choice, best)) continue;
    found = sample.get();
    found_seq = seq;
    best = choice;
  }
  if (found) return heads_of(found_seq, *found);
  // Finished since: a dashboard asks for what its last overview listed, one step later.
  const KvSnapshot::Heads* finished = nullptr;
  for (const Finished& f : finished_) {
    if (now - f.shown.finished_at > kFinishedWindow) break;  // as the overview lists them
    if (!better(f.heads.label_id, f.heads.choice, best)) continue;
    finished = &f.heads;
    best = f.heads.choice;
  }
  if (finished) return *finished;
  return std::nullopt;
}

KvSnapshot::Heads KvSnapshots::heads_of(sched::SeqId seq, const Sample& sample) const {
  KvSnapshot::Heads heads{.label_id = sample.label->id,
                          .choice = sample.label->first_choice + sample.sample_idx,
                          .num_layers = shape_.num_layers,
                          .num_kv_heads = shape_.num_kv_heads};
  const auto num_streams = static_cast<size_t>(heads.num_layers) * heads.num_kv_heads;
  heads.heads.assign(num_streams, KvHeadSnapshot{.kind = "full"});
  if (kv_.contains(seq)) {
    const std::vector<int32_t> lengths =
        kv_.is_sparse(seq) ? kv_.stream_lengths(seq, kv_.sparse_layout(seq).num_positions)
                           : kv_.stream_lengths(seq, scheduler_.num_computed(seq));
    for (size_t s = 0; s < num_streams; ++s) heads.heads[s].num_tokens = lengths[s];
  }
  if (sample.sparsity) {
    const std::vector<sparsity::SparsityController::StreamState> states = sample.sparsity->report();
    for (size_t s = 0; s < num_streams; ++s) {
      heads.heads[s].kind = states[s].report.kind;
      heads.heads[s].num_pages_read = states[s].report.pages_read;
      heads.heads[s].recovery = states[s].recovery;
    }
  }
  return heads;
}

}  // namespace sieve::engine
