#include "server/metrics.h"

#include <prometheus/text_serializer.h>

#include <sstream>

namespace sieve::server {

namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using Buckets = prometheus::Histogram::BucketBoundaries;

// vLLM's boundaries (vllm/v1/metrics/loggers.py).
const Buckets kTtftBuckets = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                              0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                              20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const Buckets kTokenLatencyBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                      0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const Buckets kRequestLatencyBuckets = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                        5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                        60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const Buckets kNBuckets = {1, 2, 5, 10, 20};

// vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max_value.
Buckets buckets_1_2_5(int64_t max_value) {
  Buckets out;
  for (double exponent = 1;; exponent *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      const double v = m * exponent;
      if (v > static_cast<double>(max_value)) return out;
      out.push_back(v);
    }
  }
}

}  // namespace

Metrics::Metrics(const MetricsInfo& info)
    : model_name_(info.model_name), registry_(std::make_shared<prometheus::Registry>()) {
  const prometheus::Labels labels = {{"model_name", model_name_}};
  auto gauge = [&](const std::string& name, const std::string& help) {
    return &BuildGauge().Name(name).Help(help).Register(*registry_).Add(labels);
  };
  auto counter = [&](const std::string& name, const std::string& help) {
    return &BuildCounter().Name(name).Help(help).Register(*registry_).Add(labels);
  };
  auto histogram = [&](const std::string& name, const std::string& help, const Buckets& buckets) {
    return &BuildHistogram().Name(name).Help(help).Register(*registry_).Add(labels, buckets);
  };
  running_ = gauge("vllm:num_requests_running", "Number of requests in model execution batches.");
  waiting_ = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.");
  kv_usage_ = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.");
  kv_usage_v0_ = gauge("vllm:gpu_cache_usage_perc",
                       "KV-cache usage (vLLM v0 name). 1 means 100 percent usage.");
  kv_pages_used_ =
      gauge("sieve:kv_pages_used", "KV pages referenced by running or waiting sequences.");
  kv_pages_free_ =
      gauge("sieve:kv_pages_free",
            "KV pages free, including cached prefix pages and parked compressed states that can be "
            "taken back.");
  // Bytes, because pages differ in size between KV dtypes (a q4 page is 0.16x an f32 one).
  kv_bytes_used_ = gauge("sieve:kv_cache_used_bytes",
                         "Bytes of K/V in pages referenced by running or waiting sequences.");
  kv_bytes_total_ = gauge("sieve:kv_cache_total_bytes", "Bytes of K/V of the whole page pool.");
  BuildGauge()
      .Name("vllm:cache_config_info")
      .Help("Information of the KV cache configuration.")
      .Register(*registry_)
      .Add({{"model_name", model_name_},
            {"block_size", std::to_string(info.page_size)},
            {"num_gpu_blocks", std::to_string(info.num_pages)},
            {"cache_dtype", info.cache_dtype}})
      .Set(1);
  preemptions_ =
      counter("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine.");
  prompt_tokens_ = counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.");
  generation_tokens_ =
      counter("vllm:generation_tokens_total", "Number of generation tokens processed.");
  prefix_queries_ = counter("vllm:prefix_cache_queries_total",
                            "Prefix cache queries, in terms of number of queried tokens.");
  prefix_hits_ = counter("vllm:prefix_cache_hits_total",
                         "Prefix cache hits, in terms of number of cached tokens.");
  continued_requests_ =
      counter("sieve:continued_requests_total",
              "Requests that continued a finished compressed request's parked KV (a next turn).");
  continued_tokens_ = counter("sieve:continued_prompt_tokens_total",
                              "Prompt tokens those requests took from the parked KV.");
  parked_evictions_ = counter("sieve:parked_evictions_total",
                              "Parked compressed states freed to make room or replaced.");
  parked_seqs_ = gauge("sieve:parked_sequences",
                       "Finished compressed requests whose KV is kept for a next turn.");
  precise_spares_free_ =
      gauge("sieve:kv_precise_spare_areas_free",
            "Spare f16 areas left for compressed sequences' precise KV heads (q8 / q4 caches).");
  precise_copies_dropped_ =
      counter("sieve:kv_precise_copies_dropped_total",
              "Precise KV heads of compressed sequences that found no f16 area and read their "
              "q8 / q4 rows instead.");
  parked_pages_ = gauge("sieve:parked_kv_pages",
                        "KV pages they hold (free to take back: counted in sieve:kv_pages_free).");
  kv_pages_kept_ =
      counter("sieve:kv_pages_kept_total",
              "KV pages finished sequences held at their end (sparse policies hold fewer).");
  kv_pages_dense_ = counter("sieve:kv_pages_dense_total",
                            "KV pages the same finished sequences would hold with the full cache.");
  kv_bytes_kept_ =
      counter("sieve:kv_bytes_kept_total", "Bytes of K/V finished sequences held at their end.");
  kv_bytes_dense_ =
      counter("sieve:kv_bytes_dense_total",
              "Bytes of K/V the same finished sequences would hold with the full cache.");
  attention_recovery_ =
      histogram("sieve:attention_recovery_ratio",
                "Attention mass kept by a sparse policy at compression (scored policies only).",
                {0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 1.0});
  success_ = &BuildCounter()
                  .Name("vllm:request_success_total")
                  .Help("Count of finished requests.")
                  .Register(*registry_);
  for (const char* reason : {"stop", "length", "abort"}) {
    success_->Add({{"model_name", model_name_}, {"finished_reason", reason}});
  }
  ttft_ = histogram("vllm:time_to_first_token_seconds",
                    "Histogram of time to first token in seconds.", kTtftBuckets);
  itl_ = histogram("vllm:inter_token_latency_seconds",
                   "Histogram of inter-token latency in seconds.", kTokenLatencyBuckets);
  tpot_v0_ = histogram(
      "vllm:time_per_output_token_seconds",
      "Histogram of time per output token in seconds (vLLM v0 name of the inter-token latency).",
      kTokenLatencyBuckets);
  request_tpot_ =
      histogram("vllm:request_time_per_output_token_seconds",
                "Histogram of time per output token per request in seconds.", kTokenLatencyBuckets);
  e2e_ = histogram("vllm:e2e_request_latency_seconds",
                   "Histogram of e2e request latency in seconds.", kRequestLatencyBuckets);
  queue_ =
      histogram("vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.", kRequestLatencyBuckets);
  inference_ =
      histogram("vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.", kRequestLatencyBuckets);
  prefill_ =
      histogram("vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.", kRequestLatencyBuckets);
  decode_ =
      histogram("vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.", kRequestLatencyBuckets);
  const Buckets token_buckets = buckets_1_2_5(info.max_model_len);
  request_prompt_tokens_ =
      histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets);
  request_generation_tokens_ = histogram("vllm:request_generation_tokens",
                                         "Number of generation tokens processed.", token_buckets);
  request_n_ =
      histogram("vllm:request_params_n", "Histogram of the n request parameter.", kNBuckets);
  request_max_tokens_ = histogram("vllm:request_params_max_tokens",
                                  "Histogram of the max_tokens request parameter.", token_buckets);
  spec_drafts_ = counter("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.");
  spec_draft_tokens_ =
      counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.");
  spec_accepted_tokens_ =
      counter("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.");
  spec_accepted_per_pos_ = &BuildCounter()
                                .Name("vllm:spec_decode_num_accepted_tokens_per_pos_total")
                                .Help("Accepted tokens per draft position.")
                                .Register(*registry_);
  for (int32_t i = 0; i < info.num_speculative_tokens; ++i) accepted_at(static_cast<size_t>(i));
}

prometheus::Counter& Metrics::accepted_at(size_t position) {
  if (position >= last_spec_accepted_per_pos_.size())
    last_spec_accepted_per_pos_.resize(position + 1, 0);
  return spec_accepted_per_pos_->Add(
      {{"model_name", model_name_}, {"position", std::to_string(position)}});
}

void Metrics::observe(const SequenceRecord& r) {
  std::lock_guard lock(mutex_);
  success_->Add({{"model_name", model_name_}, {"finished_reason", r.finished_reason}}).Increment();
  prompt_tokens_->Increment(static_cast<double>(r.prompt_tokens));
  kv_pages_kept_->Increment(static_cast<double>(r.kv_pages));
  kv_pages_dense_->Increment(static_cast<double>(r.kv_dense_pages));
  kv_bytes_kept_->Increment(static_cast<double>(r.kv_bytes));
  kv_bytes_dense_->Increment(static_cast<double>(r.kv_dense_bytes));
  if (r.attention_recovery) attention_recovery_->Observe(*r.attention_recovery);
  request_prompt_tokens_->Observe(static_cast<double>(r.prompt_tokens));
  request_generation_tokens_->Observe(static_cast<double>(r.generation_tokens));
  request_n_->Observe(r.n);
  if (r.max_tokens) request_max_tokens_->Observe(*r.max_tokens);
  const engine::Timings& t = r.timings;
  e2e_->Observe(t.total_seconds);
  queue_->Observe(t.queue_seconds);
  inference_->Observe(std::max(0.0, t.total_seconds - t.queue_seconds));
  if (t.token_seconds.empty()) return;
  ttft_->Observe(t.first_token_seconds);
  prefill_->Observe(std::max(0.0, t.first_token_seconds - t.queue_seconds));
  decode_->Observe(std::max(0.0, t.total_seconds - t.first_token_seconds));
  for (size_t i = 1; i < t.token_seconds.size(); ++i) {
    const double gap = t.token_seconds[i] - t.token_seconds[i - 1];
    itl_->Observe(gap);
    tpot_v0_->Observe(gap);
  }
  if (t.token_seconds.size() > 1) {
    request_tpot_->Observe((t.token_seconds.back() - t.token_seconds.front()) /
                           (t.token_seconds.size() - 1));
  }
}

void Metrics::sync_counter(prometheus::Counter& counter, int64_t& last, int64_t now) {
  if (now > last) counter.Increment(static_cast<double>(now - last));
  last = std::max(last, now);
}

std::string Metrics::render(const engine::EngineStats& stats) {
  std::lock_guard lock(mutex_);
  running_->Set(stats.num_running);
  waiting_->Set(stats.num_waiting);
  kv_usage_->Set(stats.kv.usage());
  kv_usage_v0_->Set(stats.kv.usage());
  kv_pages_used_->Set(stats.kv.num_pages - stats.kv.num_free_pages);
  kv_pages_free_->Set(stats.kv.num_free_pages);
  kv_bytes_used_->Set(static_cast<double>(stats.kv_bytes_used()));
  kv_bytes_total_->Set(static_cast<double>(stats.kv_bytes_total()));
  sync_counter(*preemptions_, last_preemptions_, stats.num_preemptions);
  sync_counter(*generation_tokens_, last_generated_, stats.num_generated_tokens);
  sync_counter(*prefix_queries_, last_prefix_queries_, stats.kv.num_prefix_query_tokens);
  sync_counter(*prefix_hits_, last_prefix_hits_, stats.kv.num_prefix_hit_tokens);
  sync_counter(*continued_requests_, last_continued_requests_, stats.num_continued_requests);
  sync_counter(*continued_tokens_, last_continued_tokens_, stats.num_continued_tokens);
  sync_counter(*parked_evictions_, last_parked_evictions_, stats.kv.num_parked_evictions);
  parked_seqs_->Set(stats.kv.num_parked_seqs);
  parked_pages_->Set(stats.kv.num_parked_pages);
  precise_spares_free_->Set(stats.kv.num_free_spare_areas);
  sync_counter(*precise_copies_dropped_, last_precise_copies_dropped_,
               stats.kv.num_dropped_f16_copies);
  sync_counter(*spec_drafts_, last_spec_drafts_, stats.spec_num_drafts);
  sync_counter(*spec_draft_tokens_, last_spec_draft_tokens_, stats.spec_num_draft_tokens);
  sync_counter(*spec_accepted_tokens_, last_spec_accepted_tokens_, stats.spec_num_accepted_tokens);
  for (size_t i = 0; i < stats.spec_accepted_per_position.size(); ++i) {
    const int64_t now = stats.spec_accepted_per_position[i];
    if (now == 0 && i >= last_spec_accepted_per_pos_.size()) continue;  // not exported yet
    prometheus::Counter& counter = accepted_at(i);
    sync_counter(counter, last_spec_accepted_per_pos_[i], now);
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

}  // namespace sieve::server
