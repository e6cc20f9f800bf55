#pragma once
// `sieve serve`: the OpenAI-compatible HTTP front of the engine. Thin by design:
//
//   I/O threads (HttpTransport, event-driven): read requests under deadlines and limits, find
//                 the route (HttpServer::kRoutes), answer /health, /ready, /metrics and
//                 /v1/models at once, write responses and SSE chunks; GET /v1/kv/state asks the
//                 engine for a snapshot at its next step boundary and answers from the
//                 connection's strand (server/kv_state.h)
//   handler threads: the routes with a body: body ─► api_requests.h (parses, tokenizes) ─►
//                 /tokenize, /detokenize answer; completions, on the connection's strand:
//                 Engine::submit (one per prompt) (http_generation.cc)
//   engine thread (Engine::start): steps the batch; each sequence's events are posted to its
//                 connection's strand, which turns them into the JSON response or SSE chunks
//   client gone or too slow: the transport aborts the response ─► Engine::cancel ─► pages back
//                 to the pool at the next step
//
// No thread waits on a client: an open connection holds a socket, not a thread. No lock is held
// across inference; an exchange's state is only touched on its connection's strand.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "grammar/grammar_cache.h"
#include "server/http_transport.h"
#include "server/api_requests.h"
#include "server/api_responses.h"
#include "server/metrics.h"
#include "server/web_assets.h"

namespace sieve::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;
  // >= 0: /health, /ready and /metrics are also served on this port by a listener and thread of
  // their own (0: any free port), e.g. for a load balancer's probes and a Prometheus scraper.
  int metrics_port = -1;
  std::string api_key;  // empty: no authentication
  // Names clients may give as "model": the first is the model's name in responses and metrics,
  // the rest are aliases. Empty: the model's own name.
  std::vector<std::string> served_model_names;
  // Origins a browser page may call the API from (CORS); empty: none, "*": any.
  std::vector<std::string> allowed_origins;
  // The web page's files (GET / and /webui/...), served without the API key: the page asks the
  // user for it. Empty: no page (--no-webui).
  std::span<const WebAsset> web_assets;
  HttpLimits limits;
  int io_threads = 2;       // event loop threads (they never wait on a client)
  int handler_threads = 2;  // parse and tokenize request bodies off the I/O threads
  // Answers whose token ids a next turn keeps when it sends the answer back as text, so that it
  // continues the conversation's KV (AnswerTokens); 0: prompts are always tokenized afresh.
  size_t remembered_answers = 256;
  std::chrono::milliseconds shutdown_grace{10000};
};

// What the server serves once the model is loaded.
struct Backend {
  std::shared_ptr<engine::Engine> engine;
  std::shared_ptr<const tok::Tokenizer> tokenizer;
  std::string model_name;                  // as responses and metrics name it
  std::vector<std::string> model_aliases;  // other names requests may use
  int64_t context_length = 0;
  std::function<std::string(const json&)> render_chat;
  sparsity::PolicySpec default_kv_policy;
  // Constrained decoding's compiled grammars for this model (null: refused).
  std::shared_ptr<grammar::GrammarCache> grammars;
  // How the model writes tool calls (--tool-call-parser, else detected from the chat template).
  ToolCallFormat tool_call_format = ToolCallFormat::kNone;
  // Recent answers' ids (ServerConfig::remembered_answers; set_backend makes it).
  std::shared_ptr<AnswerTokens> answers;
  // Sampling defaults from the model's generation_config.json (--generation-config).
  hf::GenerationConfig sampling_defaults;

  // What request parsing needs to know of this model.
  ModelInfo model_info() const;
};

class HttpServer {
 public:
  explicit HttpServer(ServerConfig config);
  ~HttpServer();

  // Binds the socket(s) (throws sieve::Error when it cannot). port 0 picks a free port.
  void bind();
  int port() const { return bound_port_; }
  int metrics_port() const { return bound_metrics_port_; }
  // Serves until stop(); call from one thread. /health and /ready answer 503 until set_backend().
  void listen();
  // Makes the model available; /health (liveness) and /ready (readiness) turn 200.
  void set_backend(Backend backend);
  // Graceful shutdown (a drain): /ready turns 503 and new work is refused with 503 at once, so a
  // balancer stops sending and may retry elsewhere; /health stays 200 (the process is alive);
  // running requests finish for up to config.shutdown_grace, the rest are cancelled, then the
  // server stops listening. Returns when listen() may return.
  void shutdown();

  int64_t num_active_requests() const { return active_requests_.load(); }
  HttpTransportStats transport_stats() const;

 private:
  struct Exchange;
  struct Workers;
  static constexpr const char* kJsonType = "application/json";
  using Handler = void (HttpServer::*)(const HttpRequest&, const std::shared_ptr<Responder>&);
  // Where a handler runs: at once on the I/O thread, or on a handler thread because it parses a
  // body (a large prompt must not delay anyone's /health).
  enum class Runs { kAtOnce, kOnWorker };
  // One endpoint: method, path (a trailing '*' matches the rest), handler, where it runs, and
  // whether it is a probe (served without the API key and while the model loads).
  struct Route {
    std::string_view method;
    std::string_view path;
    Handler handler;
    Runs runs = Runs::kAtOnce;
    bool probe = false;
  };
  static const Route kRoutes[];
  struct RouteMatch {
    const Route* route = nullptr;  // the route of the method and path
    const Route* path = nullptr;   // a route of the path (any method)
  };
  static RouteMatch find_route(const HttpRequest& request);

  void route(HttpRequest request, std::shared_ptr<Responder> responder);
  void route_probe(HttpRequest request, std::shared_ptr<Responder> responder);
  // Runs the route's handler (on a handler thread when it says so); an ApiException it throws
  // becomes its error response, any other exception a 500.
  void dispatch(const Route& route, HttpRequest request, std::shared_ptr<Responder> responder);
  void serve_health(const HttpRequest& request, const std::shared_ptr<Responder>& responder);
  void serve_ready(const HttpRequest& request, const std::shared_ptr<Responder>& responder);
  void serve_metrics(const HttpRequest& request, const std::shared_ptr<Responder>& responder);
  void serve_models(const HttpRequest& request, const std::shared_ptr<Responder>& responder);
  void serve_model(const HttpRequest& request, const std::shared_ptr<Responder>& responder);
  void serve_kv_state(const HttpRequest& request, const std::shared_ptr<Responder>& responder);
  void serve_reset_prefix_cache(const HttpRequest& request,
                                const std::shared_ptr<Responder>& responder);
  void serve_tokenize(const HttpRequest& request, const std::shared_ptr<Responder>& responder);
  void serve_detokenize(const HttpRequest& request, const std::shared_ptr<Responder>& responder);
  void serve_completions(const HttpRequest& request, const std::shared_ptr<Responder>& responder);
  void serve_chat(const HttpRequest& request, const std::shared_ptr<Responder>& responder);
  bool serve_web_asset(const HttpRequest& request, Responder& responder);

  // Completions (http_generation.cc).
  void handle_generation(ApiKind kind, const HttpRequest& request,
                         const std::shared_ptr<Responder>& responder);
  void start_generation(const std::shared_ptr<Exchange>& exchange);
  void on_event(Exchange& exchange, const engine::RequestEvent& event);
  void complete_if_done(Exchange& exchange);
  void apply(Exchange& exchange, const engine::RequestEvent& event);
  void finish_exchange(Exchange& exchange, std::string_view status);
  // Shutdown after the grace period: every exchange still running ends with a 503.
  void cancel_exchanges();

  HttpHeaders cors_headers(const HttpRequest& request) const;
  void send(const HttpRequest& request, Responder& responder, int status, const json& body);
  void send_error(const HttpRequest& request, Responder& responder, const ApiError& error);
  std::shared_ptr<const Backend> backend() const;

  ServerConfig config_;
  std::unique_ptr<HttpTransport> transport_;
  std::unique_ptr<HttpTransport> probe_transport_;  // --metrics-port
  std::unique_ptr<Workers> workers_;
  int bound_port_ = 0;
  int bound_metrics_port_ = -1;

  std::mutex exchanges_mutex_;
  std::unordered_map<Exchange*, std::weak_ptr<Exchange>> exchanges_;  // in flight, for shutdown

  mutable std::mutex backend_mutex_;
  std::shared_ptr<const Backend> backend_;
  std::unique_ptr<Metrics> metrics_;

  std::atomic<bool> draining_{false};
  std::atomic<bool> cancel_all_{false};
  std::atomic<int64_t> active_requests_{0};
  std::atomic<uint64_t> next_log_id_{1};
};

}  // namespace sieve::server
