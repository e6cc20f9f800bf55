#include "loadgen/runner.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <span>
#include <thread>
#include <utility>

#include "util/error.h"

namespace sieve::loadgen {

namespace {

// Workers take prompt indices from a queue the dispatcher fills at each arrival time; the
// number of workers is the concurrency limit.
class Dispatch {
 public:
  void push(size_t index) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(index);
    }
    ready_.notify_one();
  }
  void close() {
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
    }
    ready_.notify_all();
  }
  std::optional<size_t> pop() {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return closed_ || !queue_.empty(); });
    if (queue_.empty()) return std::nullopt;
    const size_t index = queue_.front();
    queue_.pop_front();
    return index;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<size_t> queue_;
  bool closed_ = false;
};

struct Batch {
  std::vector<RequestRecord> records;
  double duration_s = 0;
  int max_in_flight = 0;
};

// Worker w sends on connections[w]; there are as many workers as connections.
Batch send_all(std::span<const std::unique_ptr<Connection>> connections,
               const std::vector<Prompt>& prompts, const std::vector<double>& arrivals,
               const ProgressCallback& progress) {
  const auto num_workers = static_cast<int>(connections.size());
  Batch batch;
  batch.records.resize(prompts.size());
  Dispatch dispatch;
  std::mutex progress_mutex;
  int64_t done = 0, failed = 0;
  int in_flight = 0;
  const Clock::time_point run_start = Clock::now();
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(num_workers));
  for (int w = 0; w < num_workers; ++w) {
    workers.emplace_back([&, w] {
      while (std::optional<size_t> index = dispatch.pop()) {
        {
          std::lock_guard lock(progress_mutex);
          batch.max_in_flight = std::max(batch.max_in_flight, ++in_flight);
        }
        RequestRecord record =
            connections[static_cast<size_t>(w)]->send(prompts[*index], run_start);
        std::lock_guard lock(progress_mutex);
        --in_flight;
        ++done;
        if (!record.ok) ++failed;
        batch.records[*index] = std::move(record);
        if (progress) progress(done, static_cast<int64_t>(prompts.size()), failed);
      }
    });
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::this_thread::sleep_until(run_start + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(arrivals[i])));
    dispatch.push(i);
  }
  dispatch.close();
  for (std::thread& worker : workers) worker.join();
  for (const RequestRecord& r : batch.records)
    batch.duration_s = std::max(batch.duration_s, r.start_s + r.e2el_s);
  return batch;
}

// One JSON merge patch equal to applying a, then b. Unlike merge_patch, nulls are kept: they
// still have to delete the field from the request body.
nlohmann::json compose_patches(const nlohmann::json& a, const nlohmann::json& b) {
  if (!a.is_object() || !b.is_object()) return b;
  nlohmann::json out = a;
  for (const auto& [key, value] : b.items()) {
    out[key] = out.contains(key) ? compose_patches(out[key], value) : value;
  }
  return out;
}

// The point's client configuration (its --extra-body merged in) and how many workers it runs
// for `num_items` requests or conversations.
std::pair<ClientConfig, size_t> point_setup(const ClientConfig& base_config, const RunPoint& point,
                                            const RunOptions& options, size_t num_items) {
  if (point.max_concurrency && *point.max_concurrency <= 0) {
    fail("the concurrency must be positive (got {})", *point.max_concurrency);
  }
  ClientConfig config = base_config;
  if (!point.extra_body.empty())
    config.extra_body = compose_patches(config.extra_body, point.extra_body);
  const int cap = point.max_concurrency.value_or(options.max_threads);
  return {config, static_cast<size_t>(std::clamp<size_t>(num_items, 1, static_cast<size_t>(cap)))};
}

}  // namespace

RunResult run_conversations(const ServerUrl& url, const ClientConfig& base_config,
                            const std::vector<Conversation>& conversations, const RunPoint& point,
                            const RunOptions& options, const ProgressCallback& progress) {
  // Not a structured binding: the workers' lambda captures config (Clang before 16 cannot).
  const std::pair<ClientConfig, size_t> setup =
      point_setup(base_config, point, options, conversations.size());
  const ClientConfig& config = setup.first;
  const size_t num_workers = setup.second;
  std::vector<size_t> first_record(conversations.size() + 1, 0);
  for (size_t c = 0; c < conversations.size(); ++c)
    first_record[c + 1] = first_record[c] + conversations[c].turns.size();
  const auto total = static_cast<int64_t>(first_record.back());
  std::vector<RequestRecord> records(static_cast<size_t>(total));
  const std::vector<double> arrivals =
      arrival_times({point.request_rate, point.burstiness, options.seed},
                    static_cast<int64_t>(conversations.size()));
  Dispatch dispatch;
  std::mutex progress_mutex;
  int64_t done = 0, failed = 0;
  int in_flight = 0, max_in_flight = 0;
  const Clock::time_point run_start = Clock::now();
  std::vector<std::thread> workers;
  for (size_t w = 0; w < num_workers; ++w) {
    workers.emplace_back([&] {
      Connection connection(url, config);
      while (std::optional<size_t> c = dispatch.pop()) {
        const std::vector<Prompt>& turns = conversations[*c].turns;
        Prompt sent;
        bool ok = true;
        for (size_t t = 0; t < turns.size(); ++t) {
          RequestRecord& record = records[first_record[*c] + t];
          if (ok) {
            if (t == 0) {
              sent = turns[0];
            } else {
              const RequestRecord& previous = records[first_record[*c] + t - 1];
              if (config.endpoint == ApiEndpoint::kChat) {
                nlohmann::json messages =
                    sent.messages
                        ? *sent.messages
                        : nlohmann::json::array({{{"role", "user"}, {"content", sent.text}}});
                messages.push_back({{"role", "assistant"}, {"content", previous.generated_text}});
                messages.push_back({{"role", "user"}, {"content", turns[t].text}});
                sent.messages = std::move(messages);
              } else {
                sent.text += previous.generated_text + turns[t].text;
              }
              sent.input_tokens.reset();  // the answers' tokens are the server's to count
              sent.output_tokens = turns[t].output_tokens;
            }
            {
              std::lock_guard lock(progress_mutex);
              max_in_flight = std::max(max_in_flight, ++in_flight);
            }
            record = connection.send(sent, run_start);
            std::lock_guard lock(progress_mutex);
            --in_flight;
            ok = record.ok;
          } else {
            record.error = "an earlier turn of the conversation failed";
          }
          record.conversation = static_cast<int32_t>(*c);
          record.turn = static_cast<int32_t>(t);
          std::lock_guard lock(progress_mutex);
          ++done;
          if (!record.ok) ++failed;
          if (progress) progress(done, total, failed);
        }
      }
    });
  }
  for (size_t c = 0; c < conversations.size(); ++c) {
    std::this_thread::sleep_until(run_start + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(arrivals[c])));
    dispatch.push(c);
  }
  dispatch.close();
  for (std::thread& worker : workers) worker.join();
  double duration_s = 0;
  for (const RequestRecord& r : records) duration_s = std::max(duration_s, r.start_s + r.e2el_s);
  RunResult result;
  result.point = point;
  result.summary = summarize(records, duration_s, options.slo);
  result.summary.max_in_flight = max_in_flight;
  result.records = std::move(records);
  return result;
}

RunResult run_point(const ServerUrl& url, const ClientConfig& base_config,
                    const std::vector<Prompt>& prompts, const std::vector<Prompt>& warmup,
                    const RunPoint& point, const RunOptions& options,
                    const ProgressCallback& progress) {
  const auto [config, num_workers] = point_setup(base_config, point, options, prompts.size());
  std::vector<std::unique_ptr<Connection>> connections;
  for (size_t w = 0; w < num_workers; ++w)
    connections.push_back(std::make_unique<Connection>(url, config));
  // Warmup requests also open the first connections of the measured run.
  if (!warmup.empty()) {
    send_all(std::span(connections).first(std::min(warmup.size(), connections.size())), warmup,
             std::vector<double>(warmup.size(), 0.0), {});
  }
  const std::vector<double> arrivals = arrival_times(
      {point.request_rate, point.burstiness, options.seed}, static_cast<int64_t>(prompts.size()));
  Batch batch = send_all(connections, prompts, arrivals, progress);
  RunResult result;
  result.point = point;
  result.summary = summarize(batch.records, batch.duration_s, options.slo);
  result.summary.max_in_flight = batch.max_in_flight;
  result.records = std::move(batch.records);
  return result;
}

}  // namespace sieve::loadgen
