#pragma once
// The engine's KV snapshot stage (the snapshot's contents: engine/kv_snapshot.h): asks queued from
// any thread, answered by the stepping thread at a step boundary; while someone polls the
// overview, each step's end publishes one that overview asks get at once.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "engine/kv_snapshot.h"
#include "engine/request.h"
#include "engine/sample.h"
#include "kernels/backend.h"
#include "kv/kv_manager.h"
#include "model/kv_cache.h"
#include "sched/scheduler.h"

namespace sieve::engine {

class KvSnapshots {
 public:
  // What a snapshot reports of the engine's cache beside the pool's own counts.
  struct CacheShape {
    int32_t page_size = 0;
    int64_t bytes_per_page = 0;
    kernels::DType kv_dtype = model::kKvDefaultDType;
    int32_t num_layers = 0;
    int32_t num_kv_heads = 0;
    std::vector<int32_t> precise_streams;  // model::KvCache's
  };
  // Reads `kv`, `scheduler` and `samples` on the stepping thread only (serve(), publish()).
  KvSnapshots(const CacheShape& shape, const kv::KvManager& kv, const sched::Scheduler& scheduler,
              const Samples& samples)
      : shape_(shape), kv_(kv), scheduler_(scheduler), samples_(samples) {}

  // An overview ask within this window of the last one keeps every step publishing.
  static constexpr std::chrono::seconds kWatchWindow{3};
  // Finished sequences reported (KvSnapshot::finished): the last this many, for this long.
  static constexpr size_t kMaxFinished = 16;
  static constexpr std::chrono::seconds kFinishedWindow{60};

  // Any thread. Answers `done` at once from the published snapshot when there is one (an
  // overview while watched) and returns false; otherwise queues the ask and returns true: the
  // caller wakes the stepping thread, which answers it in serve().
  bool request(KvSnapshotQuery query, KvSnapshotSink done);
  // Asks are queued (relaxed: the one thing a step reads when nobody asked).
  bool asked() const { return asked_.load(std::memory_order_relaxed); }
  // Stepping thread, between steps: answers the queued asks.
  void serve();
  // Stepping thread, at a step's end: publishes a snapshot while watched, stops when nobody
  // polled within kWatchWindow.
  void publish();
  // Stepping thread, as `seq` finishes (`finish_reason`: "stop", "length", "cancelled"), before
  // its pages go back: keeps its last figures for KvSnapshot::finished, and its heads for an ask
  // that names it (a dashboard whose overview still listed it live). O(pages it holds + streams).
  void record_finished(sched::SeqId seq, const Sample& sample, std::string_view finish_reason);

 private:
  struct Ask {
    KvSnapshotQuery query;
    KvSnapshotSink done;
  };
  struct Finished {
    KvFinishedSnapshot shown;  // copied into every overview
    KvSnapshot::Heads heads;   // only into an ask that names it
  };
  KvSnapshot make() const;
  std::vector<std::pair<int32_t, int32_t>> precise_heads() const;
  KvSequenceSnapshot sequence(sched::SeqId seq, const Sample& sample) const;
  std::optional<KvSnapshot::Heads> heads(const KvSnapshotQuery& query,
                                         std::chrono::system_clock::time_point now) const;
  KvSnapshot::Heads heads_of(sched::SeqId seq, const Sample& sample) const;

  const CacheShape shape_;
  const kv::KvManager& kv_;
  const sched::Scheduler& scheduler_;
  const Samples& samples_;
  std::deque<Finished> finished_;  // newest first; stepping thread only

  mutable std::mutex mutex_;
  std::vector<Ask> asks_;
  std::atomic<bool> asked_{false};  // asks_ is not empty
  // Someone polled within kWatchWindow (until watched_until_): publish() publishes
  // watched_snapshot_ each step.
  std::atomic<bool> watched_{false};
  Clock::time_point watched_until_;
  std::shared_ptr<const KvSnapshot> watched_snapshot_;
};

}  // namespace sieve::engine
