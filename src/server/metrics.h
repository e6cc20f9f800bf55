#pragma once
// Prometheus metrics under the names vLLM exports, so that dashboards, autoscalers and the
// Gateway API inference extension written for vLLM read sieve unchanged. Every series carries
// a model_name label; histograms use vLLM's bucket boundaries.
//
// Engine-level values (running, waiting, KV usage, cumulative token, cache and spec-decode
// counters) are sampled from Engine::stats() at scrape time; request-level histograms are observed
// when each sequence finishes.
//
// Speculative decoding, as vLLM's spec_decode counters (always exported: a request may speculate
// on a server that does not by default):
//   vllm:spec_decode_num_drafts_total                 verification steps of a sequence with a draft
//   vllm:spec_decode_num_draft_tokens_total           draft tokens verified
//   vllm:spec_decode_num_accepted_tokens_total        draft tokens accepted
//   vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}   accepted at draft position
//       i (0-based); positions below the server's num_speculative_tokens from the start, others
//       once they count
// so the acceptance rate is accepted / draft_tokens and the mean accepted length per draft is
// 1 + accepted / drafts.
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"

namespace sieve::server {

// One finished sequence (one choice), as the engine timed it.
struct SequenceRecord {
  std::string finished_reason;  // "stop", "length" or "abort"
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  int64_t kv_pages = 0;        // pages held at the end (0 when unknown, e.g. aborted)
  int64_t kv_dense_pages = 0;  // the same tokens with the full cache
  int64_t kv_bytes = 0;        // the same two in bytes of the cache's dtype
  int64_t kv_dense_bytes = 0;
  std::optional<float> attention_recovery;
  int32_t n = 1;
  std::optional<int32_t> max_tokens;
  engine::Timings timings;
};

// What the metrics describe: the served model and the engine's configuration.
struct MetricsInfo {
  std::string model_name;
  int64_t max_model_len = 0;
  int32_t page_size = 0;
  int32_t num_pages = 0;
  std::string cache_dtype;             // model::kv_dtype_name, for vllm:cache_config_info
  int32_t num_speculative_tokens = 0;  // the server's default (0: off)
};

class Metrics {
 public:
  explicit Metrics(const MetricsInfo& info);

  void observe(const SequenceRecord& record);
  // Prometheus text format, with gauges and counters brought up to date from `stats`.
  std::string render(const engine::EngineStats& stats);

 private:
  void sync_counter(prometheus::Counter& counter, int64_t& last, int64_t now);
  prometheus::Counter& accepted_at(size_t position);

  std::string model_name_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::mutex mutex_;

  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* kv_usage_;
  prometheus::Gauge* kv_usage_v0_;
  prometheus::Gauge* kv_pages_used_;
  prometheus::Gauge* kv_pages_free_;
  prometheus::Gauge* kv_bytes_used_;
  prometheus::Gauge* kv_bytes_total_;
  prometheus::Counter* preemptions_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Counter* prefix_queries_;
  prometheus::Counter* prefix_hits_;
  prometheus::Counter* continued_requests_;
  prometheus::Counter* continued_tokens_;
  prometheus::Counter* parked_evictions_;
  prometheus::Gauge* parked_seqs_;
  prometheus::Gauge* parked_pages_;
  prometheus::Gauge* precise_spares_free_;
  prometheus::Counter* precise_copies_dropped_;
  prometheus::Counter* kv_pages_kept_;
  prometheus::Counter* kv_pages_dense_;
  prometheus::Counter* kv_bytes_kept_;
  prometheus::Counter* kv_bytes_dense_;
  prometheus::Histogram* attention_recovery_;
  prometheus::Family<prometheus::Counter>* success_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* tpot_v0_;
  prometheus::Histogram* request_tpot_;
  prometheus::Histogram* e2e_;
  prometheus::Histogram* queue_;
  prometheus::Histogram* inference_;
  prometheus::Histogram* prefill_;
  prometheus::Histogram* decode_;
  prometheus::Histogram* request_prompt_tokens_;
  prometheus::Histogram* request_generation_tokens_;
  prometheus::Histogram* request_n_;
  prometheus::Histogram* request_max_tokens_;
  prometheus::Counter* spec_drafts_;
  prometheus::Counter* spec_draft_tokens_;
  prometheus::Counter* spec_accepted_tokens_;
  prometheus::Family<prometheus::Counter>* spec_accepted_per_pos_;

  // Last values synced from the engine's cumulative stats.
  int64_t last_preemptions_ = 0;
  int64_t last_generated_ = 0;
  int64_t last_prefix_queries_ = 0;
  int64_t last_prefix_hits_ = 0;
  int64_t last_continued_requests_ = 0;
  int64_t last_continued_tokens_ = 0;
  int64_t last_parked_evictions_ = 0;
  int64_t last_precise_copies_dropped_ = 0;
  int64_t last_spec_drafts_ = 0;
  int64_t last_spec_draft_tokens_ = 0;
  int64_t last_spec_accepted_tokens_ = 0;
  std::vector<int64_t> last_spec_accepted_per_pos_;  // [positions exported so far]
};

}  // namespace sieve::server
