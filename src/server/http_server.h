#pragma once
// `sieve serve`: the OpenAI-compatible HTTP front of the engine. Thin by design:
//
//   HTTP thread:  body ─► parse_generation_request ─► Engine::submit (one per prompt)
//                 wait on this exchange's event queue ─► JSON response, or SSE chunks as events
//                 come
//   engine thread (Engine::start): steps the batch; each sequence's events are pushed to its
//                 exchange's queue (never blocks)
//   client gone:  the HTTP thread sees the socket closed (or a write fail) ─► Engine::cancel ─►
//                 pages back to the pool at the next step
//
// No lock is held across inference: HTTP threads only touch their own exchange queue and the
// engine's submit/cancel/stats, which are thread-safe.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "server/metrics.h"
#include "server/openai_api.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace sieve::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;            // empty: no authentication
  std::string served_model_name;  // empty: the model's name
  size_t max_body_bytes = 8u << 20;
  int http_threads = 0;  // 0: enough for every running and queued stream
  std::chrono::milliseconds shutdown_grace{10000};
};

// What the server serves once the model is loaded.
struct Backend {
  std::shared_ptr<engine::Engine> engine;
  std::shared_ptr<const tok::Tokenizer> tokenizer;
  std::string model_name;  // as clients must name it
  int64_t context_length = 0;
  std::function<std::string(const json&)> render_chat;
  sparsity::PolicySpec default_kv_policy;
};

class HttpServer {
 public:
  explicit HttpServer(ServerConfig config);
  ~HttpServer();

  // Binds the socket (throws sieve::Error when it cannot). port 0 picks a free port.
  void bind();
  int port() const { return bound_port_; }
  // Serves until stop(); call from one thread. /health answers 503 until set_backend().
  void listen();
  // Makes the model available; /health turns 200.
  void set_backend(Backend backend);
  // Graceful shutdown: refuse new work (503), let running requests finish for up to
  // config.shutdown_grace, cancel the rest, then stop listening. Returns when listen() may return.
  void shutdown();

  int64_t num_active_requests() const { return active_requests_.load(); }

 private:
  struct Exchange;
  void install_routes();
  void handle_generation(ApiKind kind, const httplib::Request& req, httplib::Response& res);
  void apply(Exchange& exchange, const engine::RequestEvent& event);
  void finish_exchange(Exchange& exchange, std::string_view status);
  std::shared_ptr<const Backend> backend() const;

  ServerConfig config_;
  std::unique_ptr<httplib::Server> http_;
  int bound_port_ = 0;

  mutable std::mutex backend_mutex_;
  std::shared_ptr<const Backend> backend_;
  std::unique_ptr<Metrics> metrics_;

  std::atomic<bool> bound_{false};  // bind() succeeded: listen() is expected
  std::atomic<bool> draining_{false};
  std::atomic<bool> cancel_all_{false};
  std::atomic<int64_t> active_requests_{0};
  std::atomic<uint64_t> next_log_id_{1};
};

}  // namespace sieve::server
