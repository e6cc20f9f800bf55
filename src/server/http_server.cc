#include "server/http_server.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <thread>

#include "server/kv_state.h"
#include "util/error.h"

namespace sieve::server {

namespace {

using Clock = std::chrono::steady_clock;
// Paths served even when the connection limit is reached (and on --metrics-port).
const std::vector<std::string> kProbePaths = {"/health", "/ready", "/metrics"};

// Errors the transport answers itself, in the API's error shape.
std::string transport_error_body(int status, const std::string& message) {
  ApiError error{.status = status, .message = message};
  if (status == 413) error.param = "body";
  if (status == 503) error.type = "server_unavailable";
  if (status >= 500 && status != 503) error.type = "internal_server_error";
  return dump_json(error.to_json());
}

}  // namespace

ModelInfo Backend::model_info() const {
  return {.served_name = model_name,
          .aliases = model_aliases,
          .context_length = context_length,
          .num_layers = engine->model().config().num_layers,
          .num_kv_heads = engine->model().config().num_kv_heads,
          .tokenizer = tokenizer.get(),
          .render_chat = render_chat,
          .default_kv_policy = default_kv_policy,
          .grammars = grammars.get(),
          .tool_call_format = tool_call_format,
          .answers = answers.get(),
          .sampling_defaults = sampling_defaults};
}

// Request bodies are parsed and tokenized here, never on an I/O thread: a large prompt must
// not delay anyone's /health.
struct HttpServer::Workers {
  explicit Workers(int threads) : pool(static_cast<size_t>(std::max(1, threads))) {}
  boost::asio::thread_pool pool;
};

HttpServer::HttpServer(ServerConfig config)
    : config_(std::move(config)), workers_(std::make_unique<Workers>(config_.handler_threads)) {
  transport_ = std::make_unique<HttpTransport>(
      config_.limits,
      [this](HttpRequest request, std::shared_ptr<Responder> responder) {
        route(std::move(request), std::move(responder));
      },
      kProbePaths, transport_error_body);
  if (config_.metrics_port >= 0) {
    probe_transport_ = std::make_unique<HttpTransport>(
        config_.limits,
        [this](HttpRequest request, std::shared_ptr<Responder> responder) {
          route_probe(std::move(request), std::move(responder));
        },
        kProbePaths, transport_error_body);
  }
}

HttpServer::~HttpServer() {
  transport_->stop();
  if (probe_transport_) probe_transport_->stop();
  workers_->pool.join();
}

std::shared_ptr<const Backend> HttpServer::backend() const {
  std::lock_guard lock(backend_mutex_);
  return backend_;
}

HttpTransportStats HttpServer::transport_stats() const { return transport_->stats(); }

void HttpServer::set_backend(Backend backend) {
  const engine::EngineConfig& ec = backend.engine->config();
  auto metrics = std::make_unique<Metrics>(
      MetricsInfo{.model_name = backend.model_name,
                  .max_model_len = backend.context_length,
                  .page_size = ec.page_size,
                  .num_pages = ec.num_kv_pages,
                  .cache_dtype = std::string(model::kv_dtype_name(ec.kv_dtype)),
                  .num_speculative_tokens =
                      ec.speculative.enabled() ? ec.speculative.num_speculative_tokens : 0});
  if (!backend.answers && config_.remembered_answers > 0) {
    backend.answers =
        std::make_shared<AnswerTokens>(*backend.tokenizer, config_.remembered_answers);
  }
  std::lock_guard lock(backend_mutex_);
  metrics_ = std::move(metrics);
  backend_ = std::make_shared<const Backend>(std::move(backend));
}

void HttpServer::bind() {
  // Every connection is a file descriptor: make room for the connection limit.
  const uint64_t fd_limit = raise_open_file_limit();
  const size_t wanted = config_.limits.max_connections + config_.limits.reserved_connections;
  if (wanted + 64 > fd_limit) {
    spdlog::warn(
        "open-file limit {} is below max connections {} + {} reserved: connections beyond "
        "it are refused by the kernel",
        fd_limit, config_.limits.max_connections, config_.limits.reserved_connections);
  }
  bound_port_ = transport_->bind(config_.host, config_.port);
  if (probe_transport_) {
    bound_metrics_port_ = probe_transport_->bind(config_.host, config_.metrics_port);
  }
}

void HttpServer::listen() {
  std::thread probes;
  if (probe_transport_) probes = std::thread([this] { probe_transport_->run(1); });
  transport_->run(std::max(1, config_.io_threads));
  if (probes.joinable()) probes.join();
}

void HttpServer::shutdown() {
  draining_ = true;
  const auto deadline = Clock::now() + config_.shutdown_grace;
  while (active_requests_.load() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (active_requests_.load() > 0) {
    spdlog::warn("shutdown: cancelling {} request(s) still running after the grace period",
                 active_requests_.load());
    cancel_exchanges();
    const auto hard_deadline = Clock::now() + std::chrono::seconds(5);
    while (active_requests_.load() > 0 && Clock::now() < hard_deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  transport_->stop();
  if (probe_transport_) probe_transport_->stop();
}

HttpHeaders HttpServer::cors_headers(const HttpRequest& request) const {
  if (config_.allowed_origins.empty()) return {};
  const std::string origin = request.header("origin");
  if (origin.empty()) return {};
  const auto& allowed = config_.allowed_origins;
  if (std::find(allowed.begin(), allowed.end(), "*") != allowed.end()) {
    return {{"Access-Control-Allow-Origin", "*"}};
  }
  if (std::find(allowed.begin(), allowed.end(), origin) == allowed.end()) return {};
  return {{"Access-Control-Allow-Origin", origin}, {"Vary", "Origin"}};
}

void HttpServer::send(const HttpRequest& request, Responder& responder, int status,
                      const json& body) {
  responder.respond(HttpResponse{.status = status,
                                 .content_type = kJsonType,
                                 .body = dump_json(body),
                                 .headers = cors_headers(request)});
}

void HttpServer::send_error(const HttpRequest& request, Responder& responder,
                            const ApiError& error) {
  send(request, responder, error.status, error.to_json());
}

// Liveness: the process answers. 200 while draining too (restarting a draining replica would
// cut its running streams); 503 only while the model loads.
void HttpServer::serve_health(const HttpRequest& request,
                              const std::shared_ptr<Responder>& responder) {
  if (!backend()) return send(request, *responder, 503, {{"status", "loading"}});
  send(request, *responder, 200, {{"status", draining_ ? "draining" : "ok"}});
}

// Readiness: whether a balancer should send new requests here.
void HttpServer::serve_ready(const HttpRequest& request,
                             const std::shared_ptr<Responder>& responder) {
  if (!backend()) return send(request, *responder, 503, {{"status", "loading"}});
  if (draining_) return send(request, *responder, 503, {{"status", "draining"}});
  send(request, *responder, 200, {{"status", "ready"}});
}

void HttpServer::serve_metrics(const HttpRequest& request,
                               const std::shared_ptr<Responder>& responder) {
  auto b = backend();
  if (!b) {
    return send_error(
        request, *responder,
        ApiError{
            .status = 503, .message = "the model is still loading", .type = "server_unavailable"});
  }
  std::string text;
  {
    std::lock_guard lock(backend_mutex_);
    text = metrics_->render(b->engine->stats());
  }
  const HttpTransportStats t = transport_->stats();
  text += fmt::format(
      "# HELP sieve:http_connections_open Client connections open now.\n"
      "# TYPE sieve:http_connections_open gauge\n"
      "sieve:http_connections_open {}\n"
      "# HELP sieve:http_connections_refused_total Connections closed at accept (over the "
      "connection limit plus its reserve).\n"
      "# TYPE sieve:http_connections_refused_total counter\n"
      "sieve:http_connections_refused_total {}\n"
      "# HELP sieve:http_connections_limited_total Requests answered 503 because the connection "
      "limit was reached.\n"
      "# TYPE sieve:http_connections_limited_total counter\n"
      "sieve:http_connections_limited_total {}\n"
      "# HELP sieve:http_requests_timed_out_total Requests dropped because head and body did "
      "not arrive within the request timeout.\n"
      "# TYPE sieve:http_requests_timed_out_total counter\n"
      "sieve:http_requests_timed_out_total {}\n"
      "# HELP sieve:http_requests_malformed_total Requests refused as malformed or too large.\n"
      "# TYPE sieve:http_requests_malformed_total counter\n"
      "sieve:http_requests_malformed_total {}\n"
      "# HELP sieve:http_responses_aborted_total Responses cut short: the client left or "
      "stopped reading.\n"
      "# TYPE sieve:http_responses_aborted_total counter\n"
      "sieve:http_responses_aborted_total {}\n",
      t.open_connections, t.refused_connections, t.limited_connections, t.timed_out_requests,
      t.malformed_requests, t.aborted_responses);
  HttpResponse response{.status = 200,
                        .content_type = "text/plain; version=0.0.4; charset=utf-8",
                        .body = std::move(text),
                        .headers = cors_headers(request)};
  responder->respond(std::move(response));
}

// The page's files hold no secret and the page must load before it can ask for the API key:
// served to anyone, also while the model loads.
bool HttpServer::serve_web_asset(const HttpRequest& request, Responder& responder) {
  if (request.method != "GET") return false;
  const auto& assets = config_.web_assets;
  const auto it = std::find_if(assets.begin(), assets.end(),
                               [&](const WebAsset& a) { return a.path == request.path; });
  if (it == assets.end()) return false;
  HttpResponse response{.status = 200,
                        .content_type = std::string(it->content_type),
                        .body = std::string(it->body),
                        .headers = cors_headers(request)};
  // Model output is rendered as (sanitized) markdown: the policy is a second line of defence,
  // allowing only the page's own scripts and styles and calls to this server.
  response.headers.emplace_back(
      "Content-Security-Policy",
      "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
      "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'");
  response.headers.emplace_back("X-Content-Type-Options", "nosniff");
  response.headers.emplace_back("Cache-Control", "no-cache");
  responder.respond(std::move(response));
  return true;
}

const HttpServer::Route HttpServer::kRoutes[] = {
    {"GET", "/health", &HttpServer::serve_health, Runs::kAtOnce, /*probe=*/true},
    {"GET", "/ready", &HttpServer::serve_ready, Runs::kAtOnce, /*probe=*/true},
    {"GET", "/metrics", &HttpServer::serve_metrics, Runs::kAtOnce},
    {"GET", "/v1/models", &HttpServer::serve_models, Runs::kAtOnce},
    {"GET", "/v1/models/*", &HttpServer::serve_model, Runs::kAtOnce},
    {"GET", "/v1/kv/state", &HttpServer::serve_kv_state, Runs::kAtOnce},
    {"POST", "/reset_prefix_cache", &HttpServer::serve_reset_prefix_cache, Runs::kAtOnce},
    {"POST", "/tokenize", &HttpServer::serve_tokenize, Runs::kOnWorker},
    {"POST", "/detokenize", &HttpServer::serve_detokenize, Runs::kOnWorker},
    {"POST", "/v1/completions", &HttpServer::serve_completions, Runs::kOnWorker},
    {"POST", "/v1/chat/completions", &HttpServer::serve_chat, Runs::kOnWorker},
};

HttpServer::RouteMatch HttpServer::find_route(const HttpRequest& request) {
  RouteMatch match;
  for (const Route& route : kRoutes) {
    const bool prefix = route.path.ends_with('*');
    const std::string_view stem = prefix ? route.path.substr(0, route.path.size() - 1) : route.path;
    const bool path_matches =
        prefix ? request.path.size() > stem.size() && request.path.starts_with(stem)
               : request.path == stem;
    if (!path_matches) continue;
    if (!match.path) match.path = &route;
    if (request.method == route.method) {
      match.route = &route;
      break;
    }
  }
  return match;
}

void HttpServer::route_probe(HttpRequest request, std::shared_ptr<Responder> responder) {
  const RouteMatch match = find_route(request);
  if (match.route &&
      std::find(kProbePaths.begin(), kProbePaths.end(), match.route->path) != kProbePaths.end()) {
    return dispatch(*match.route, std::move(request), std::move(responder));
  }
  send_error(request, *responder,
             ApiError{.status = 404,
                      .message = fmt::format("no route {} {} on the metrics port (it serves "
                                             "GET /health, GET /ready and GET /metrics)",
                                             request.method, request.path),
                      .type = "NotFoundError"});
}

void HttpServer::route(HttpRequest request, std::shared_ptr<Responder> responder) {
  Responder& r = *responder;
  if (request.method == "OPTIONS") {  // CORS preflight (or a plain OPTIONS)
    HttpResponse response{
        .status = 204, .content_type = "text/plain", .headers = cors_headers(request)};
    if (!response.headers.empty()) {
      response.headers.emplace_back("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      response.headers.emplace_back("Access-Control-Allow-Headers", "Authorization, Content-Type");
      response.headers.emplace_back("Access-Control-Max-Age", "600");
    }
    response.headers.emplace_back("Allow", "GET, POST, OPTIONS");
    return r.respond(std::move(response));
  }
  const RouteMatch match = find_route(request);
  if (match.path && match.path->probe) {  // probes: no API key
    if (!match.route) {
      return send_error(
          request, r,
          ApiError{.status = 405,
                   .message = fmt::format("{} answers {}", request.path, match.path->method)});
    }
    return dispatch(*match.route, std::move(request), std::move(responder));
  }
  if (serve_web_asset(request, r)) return;
  if (!config_.api_key.empty()) {
    const std::string auth = request.header("authorization");
    if (auth != "Bearer " + config_.api_key) {
      return send_error(
          request, r,
          ApiError{.status = 401,
                   .message = auth.empty() ? "missing API key: send 'Authorization: Bearer KEY'"
                                           : "invalid API key",
                   .type = "authentication_error",
                   .code = "invalid_api_key"});
    }
  }
  if (!backend()) {
    return send_error(
        request, r,
        ApiError{
            .status = 503, .message = "the model is still loading", .type = "server_unavailable"});
  }
  if (!match.route) {
    return send_error(
        request, r,
        ApiError{.status = match.path ? 405 : 404,
                 .message = fmt::format("no route {} {}", request.method, request.path),
                 .type = match.path ? "invalid_request_error" : "NotFoundError"});
  }
  dispatch(*match.route, std::move(request), std::move(responder));
}

void HttpServer::dispatch(const Route& route, HttpRequest request,
                          std::shared_ptr<Responder> responder) {
  auto run = [this, handler = route.handler](const HttpRequest& request,
                                             const std::shared_ptr<Responder>& responder) {
    try {
      (this->*handler)(request, responder);
    } catch (const ApiException& e) {
      send_error(request, *responder, e.error());
    } catch (const std::exception& e) {
      spdlog::error("unhandled error: {}", e.what());
      send_error(request, *responder,
                 ApiError{.status = 500, .message = e.what(), .type = "internal_server_error"});
    }
  };
  if (route.runs == Runs::kAtOnce) return run(request, responder);
  boost::asio::post(workers_->pool,
                    [run, request = std::move(request), responder = std::move(responder)] {
                      run(request, responder);
                    });
}

void HttpServer::serve_models(const HttpRequest& request,
                              const std::shared_ptr<Responder>& responder) {
  send(request, *responder, 200, model_list(backend()->model_info()));
}

void HttpServer::serve_model(const HttpRequest& request,
                             const std::shared_ptr<Responder>& responder) {
  const ModelInfo model = backend()->model_info();
  const std::string id = request.path.substr(std::string_view("/v1/models/").size());
  check_model_name(model, id);
  send(request, *responder, 200, model_card(model, id));
}

// Nothing waits here: the engine answers at its next step boundary (or at once, while a dashboard
// polls, with the snapshot its last step published) and the JSON is built on the connection's
// strand, not on the engine thread (see engine/kv_snapshot.h).
void HttpServer::serve_kv_state(const HttpRequest& request,
                                const std::shared_ptr<Responder>& responder) {
  KvStateQuery parsed = parse_kv_state_query(request.query);
  if (parsed.error) return send_error(request, *responder, *parsed.error);
  HttpHeaders headers = cors_headers(request);
  headers.emplace_back("Cache-Control", "no-store");
  const std::shared_ptr<const Backend> b = backend();
  b->engine->request_kv_snapshot(
      parsed.query, [responder, headers = std::move(headers), query = parsed.query,
                     model_name = b->model_name](engine::KvSnapshot snapshot) {
        responder->post([responder, headers, query, model_name, snapshot = std::move(snapshot)] {
          KvStateResponse response = kv_state_response(snapshot, query, model_name);
          responder->respond(HttpResponse{.status = response.status,
                                          .content_type = kJsonType,
                                          .body = dump_json(response.body),
                                          .headers = headers});
        });
      });
}

// vLLM's route: the next requests start cold (no prefix hit, no parked conversation). 409 while
// requests are in flight: their pages stay cached, and nothing is dropped.
void HttpServer::serve_reset_prefix_cache(const HttpRequest& request,
                                          const std::shared_ptr<Responder>& responder) {
  HttpHeaders headers = cors_headers(request);
  backend()->engine->request_prefix_cache_reset([responder,
                                                 headers = std::move(headers)](bool reset) {
    responder->post([responder, headers, reset] {
      const json body = reset ? json{{"reset", true}}
                              : ApiError{.status = 409,
                                         .message =
                                             "requests are in flight: the prefix cache is reset "
                                             "only while no request is queued or runs",
                                         .type = "ConflictError"}
                                    .to_json();
      responder->respond(HttpResponse{.status = reset ? 200 : 409,
                                      .content_type = kJsonType,
                                      .body = dump_json(body),
                                      .headers = headers});
    });
  });
}

void HttpServer::serve_tokenize(const HttpRequest& request,
                                const std::shared_ptr<Responder>& responder) {
  const json body = parse_request_body(request.body);
  const auto b = backend();
  const std::vector<TokenId> ids = parse_tokenize_request(body, b->model_info());
  send(request, *responder, 200, tokenize_response(ids, b->context_length));
}

void HttpServer::serve_detokenize(const HttpRequest& request,
                                  const std::shared_ptr<Responder>& responder) {
  const json body = parse_request_body(request.body);
  const auto b = backend();
  const std::vector<TokenId> ids = parse_detokenize_request(body, b->tokenizer->vocab().size());
  send(request, *responder, 200, detokenize_response(b->tokenizer->decode(ids)));
}

void HttpServer::serve_completions(const HttpRequest& request,
                                   const std::shared_ptr<Responder>& responder) {
  handle_generation(ApiKind::kCompletion, request, responder);
}

void HttpServer::serve_chat(const HttpRequest& request,
                            const std::shared_ptr<Responder>& responder) {
  handle_generation(ApiKind::kChat, request, responder);
}

}  // namespace sieve::server
