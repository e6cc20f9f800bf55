#pragma once
// A snapshot of the KV cache between two engine steps, for a live view of it (the server's
// GET /v1/kv/state, server/kv_state.h). Plain integers and strings copied out of the KV
// manager, the scheduler and the sparsity controllers; nothing is scored or recomputed.
//
// How it is taken: Engine::request_kv_snapshot queues the query; the stepping thread answers it
// at its next step boundary (an idle engine wakes for it) and calls the sink there. While
// someone polls the overview (asked within KvSnapshots::kWatchWindow, engine/kv_snapshots.h), each
// step's end also publishes one and overview asks get it at once: no wait for a boundary, at most a
// step old, for O(sequences + pool pages) of integer copies per step while watched. A step nobody
// watches pays two relaxed atomic loads; nothing on the per-token path changes.
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sieve::engine {

// Who a request is in the client's terms, given by the caller and only echoed back in snapshots
// (the server: its response id, "cmpl-..." / "chatcmpl-..."). A request's sample i is choice
// first_choice + i of that response (a completions request with several prompts submits one
// Request per prompt: prompt p's first choice is p * n).
struct RequestLabel {
  std::string id;
  int32_t first_choice = 0;
};

enum class SequencePhase : uint8_t {
  kWaiting,    // queued, never scheduled
  kPreempted,  // queued again after losing its pages (recomputed when rescheduled)
  kPrefill,    // running, prompt not all computed
  kDecode,     // running, generating
};
std::string_view phase_name(SequencePhase phase);  // "waiting", "preempted", "prefill", "decode"

// One sequence (one sample of one request).
struct KvSequenceSnapshot {
  std::string label_id;  // RequestLabel::id
  int32_t choice = 0;    // RequestLabel::first_choice + the sample's index
  std::string policy;    // the request's kv_policy, canonical (sparsity::to_string); "full" dense
  SequencePhase phase = SequencePhase::kWaiting;
  int32_t num_prompt_tokens = 0;
  int32_t num_generated_tokens = 0;
  int32_t num_context_tokens = 0;   // prompt + generated (the last sampled one not computed yet)
  int32_t num_computed_tokens = 0;  // with K/V (0 while waiting or preempted)
  int32_t num_pages_held = 0;       // pages it references (shared ones included)
  int32_t num_pages_shared = 0;     // of those, pages another sequence references too
  // ceil(num_computed_tokens / page size): what its computed tokens take dense, the yardstick
  // for a compressed sequence's num_pages_held (a dense one holds exactly this).
  int32_t num_pages_dense = 0;
  bool compressed = false;  // its streams own their slices (a policy dropped keys or selects pages)
  // The mean over scored streams of the attention mass the kept keys received from the
  // observation rows at the last compression (snapkv, pyramidkv, adakv, h2o, fastgen);
  // nullopt where nothing was scored (dense, streaming, quest, or not compressed yet).
  std::optional<float> attention_recovery;
};

// A sequence as it stood when it finished or was cancelled, its pages not yet returned: what a
// request kept (pages held against dense, recovery) stays visible after a sub-second answer.
struct KvFinishedSnapshot {
  KvSequenceSnapshot sequence;
  std::string finish_reason;  // "stop" | "length" (finish_reason_name) | "cancelled"
  std::chrono::system_clock::time_point finished_at;
};

// One (layer, KV head) stream of the sequence asked about.
struct KvHeadSnapshot {
  std::string kind;                       // sparsity::StreamReport::kind ("full" when dense)
  int32_t num_tokens = 0;                 // keys it holds
  std::optional<int32_t> num_pages_read;  // sparsity::StreamReport::pages_read
  std::optional<float> recovery;          // its own share of attention_recovery, where scored
};

struct KvSnapshotQuery {
  // Also report the heads of this request's sequence (the lowest choice when unset).
  std::optional<std::string> label_id;
  std::optional<int32_t> choice;
};

struct KvSnapshot {
  std::chrono::system_clock::time_point taken_at;
  int32_t page_size = 0;  // tokens per page
  int64_t bytes_per_page = 0;
  std::string kv_dtype;  // model::kv_dtype_name
  // (layer, kv head) pairs whose dense rows the cache also keeps in f16 (model::KvCache's
  // precise streams); their bytes are in bytes_per_page.
  std::vector<std::pair<int32_t, int32_t>> precise_heads;
  int32_t num_pages = 0;
  int32_t num_pages_used = 0;  // reference count > 0
  int32_t num_pages_free = 0;  // reference count 0, cached-free ones included, and
                               // the pages only parked sequences hold
  // Finished compressed requests kept for a next turn (kv_manager.h, parked sequences), and the
  // pages they hold: free to take back.
  int32_t num_pages_parked = 0;
  int32_t num_parked_sequences = 0;
  // Spare f16 areas of the precise heads (kv/precise_areas.h): in all and free, and the
  // compressed sequences' precise heads that found none.
  int32_t num_precise_spare_areas = 0;
  int32_t num_precise_spare_areas_free = 0;
  int64_t num_precise_copies_dropped = 0;
  int32_t num_pages_cached = 0;       // published in the prefix cache (in use or free)
  int32_t num_pages_cached_free = 0;  // of those, free: reusable by a prefix hit until evicted
  int32_t num_running = 0;            // sequences (the scheduler's counts)
  int32_t num_waiting = 0;
  std::vector<KvSequenceSnapshot> sequences;  // in admission order
  // The last sequences to finish, newest first: at most KvSnapshots::kMaxFinished, none finished
  // more than KvSnapshots::kFinishedWindow before the snapshot.
  std::vector<KvFinishedSnapshot> finished;

  struct Heads {
    std::string label_id;
    int32_t choice = 0;
    int32_t num_layers = 0;
    int32_t num_kv_heads = 0;
    std::vector<KvHeadSnapshot> heads;  // [layer * num_kv_heads + kv_head]
    // Set when the sequence has finished: its heads as they stood then (KvFinishedSnapshot's
    // finish_reason).
    std::optional<std::string> finish_reason;
  };
  // With KvSnapshotQuery::label_id: that sequence's heads, live or among `finished`; nullopt when
  // neither has that label (and choice).
  std::optional<Heads> heads;
};

using KvSnapshotSink = std::function<void(KvSnapshot)>;

}  // namespace sieve::engine
