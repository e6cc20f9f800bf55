#pragma once
// Runs one benchmark point: sends every prompt at its arrival time, at most max_concurrency at
// once, and collects the records in prompt order. Each of the max_concurrency workers is a
// thread with its own kept-alive connection; a request waits in a queue for a free worker.
#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "loadgen/arrivals.h"
#include "loadgen/client.h"
#include "loadgen/metrics.h"
#include "loadgen/workload.h"

namespace sieve::loadgen {

struct RunPoint {
  std::string label;                   // e.g. "c=8" or "rate=4"
  std::optional<double> request_rate;  // none: all requests arrive at once
  double burstiness = 1.0;
  std::optional<int> max_concurrency;  // none: unlimited (up to max_threads)
  std::optional<int> variant;          // index of the --extra-body this point used
  nlohmann::json extra_body = nlohmann::json::object();  // merged into every request
};

struct RunOptions {
  uint64_t seed = 0;
  GoodputSlo slo;
  int max_threads = 1024;  // bounds in-flight requests when no concurrency limit is given
};

struct RunResult {
  RunPoint point;
  std::vector<RequestRecord> records;  // in prompt order
  RunSummary summary;
};

// Called after each request completes, from the thread that ran it (serialised).
using ProgressCallback = std::function<void(int64_t done, int64_t total, int64_t failed)>;

// A multi-turn workload (vLLM's and SGLang's multi-turn benchmarks): each conversation is one
// simulated user who sends its turns one after another, each once the previous answer is
// complete. Turn 0 sends turns[0]; turn k > 0 sends the conversation so far (completions: the
// previous prompt + the answer's text + turns[k]'s text; chat: the messages, the answer as the
// assistant's, then turns[k] as the next user message) with turns[k]'s output length.
struct Conversation {
  std::vector<Prompt> turns;
};

// Runs conversations at most max_concurrency at once (none: all at once; request_rate: when
// each conversation starts). Records are in (conversation, turn) order, each with its indices;
// a failed turn ends its conversation (the later turns are recorded as failed, not sent).
RunResult run_conversations(const ServerUrl& url, const ClientConfig& config,
                            const std::vector<Conversation>& conversations, const RunPoint& point,
                            const RunOptions& options, const ProgressCallback& progress = {});

// Sends the warmup prompts first (not measured, same concurrency limit), then the prompts.
RunResult run_point(const ServerUrl& url, const ClientConfig& config,
                    const std::vector<Prompt>& prompts, const std::vector<Prompt>& warmup,
                    const RunPoint& point, const RunOptions& options,
                    const ProgressCallback& progress = {});

}  // namespace sieve::loadgen
