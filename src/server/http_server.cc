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
constexpr const char* kJsonType = "application/json";
// Paths served even when the connection limit is reached (and on --metrics-port).
const std::vector<std::string> kProbePaths = {"/health", "/ready", "/metrics"};

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse(const json& chunk) { return "data: " + dump(chunk) + "\n\n"; }

// Errors the transport answers itself, in the API's error shape.
std::string transport_error_body(int status, const std::string& message) {
  ApiError error{.status = status, .message = message};
  if (status == 413) error.param = "body";
  if (status == 503) error.type = "server_unavailable";
  if (status >= 500 && status != 503) error.type = "internal_server_error";
  return dump(error.to_json());
}

std::optional<json> parse_body(const HttpRequest& request, ApiError& error) {
  json body = json::parse(request.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    error = ApiError{
        .status = 400, .message = "the request body is not valid JSON (UTF-8)", .param = "body"};
    return std::nullopt;
  }
  if (!body.is_object()) {
    error = ApiError{
        .status = 400, .message = "the request body must be a JSON object", .param = "body"};
    return std::nullopt;
  }
  return body;
}

json model_card(const Backend& b, const std::string& id) {
  return json{{"id", id},
              {"object", "model"},
              {"created", std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count()},
              {"owned_by", "sieve"},
              {"root", b.model_name},
              {"parent", nullptr},
              {"max_model_len", b.context_length}};
}

bool serves_name(const Backend& b, const std::string& name) {
  return name == b.model_name ||
         std::find(b.model_aliases.begin(), b.model_aliases.end(), name) != b.model_aliases.end();
}

}  // namespace

// Request bodies are parsed and tokenized here, never on an I/O thread: a large prompt must
// not delay anyone's /health.
struct HttpServer::Workers {
  explicit Workers(int threads) : pool(static_cast<size_t>(std::max(1, threads))) {}
  boost::asio::thread_pool pool;
};

// One generation request: its engine requests, the events the engine pushed for it, and what
// its choices have produced so far. Touched only on its connection's strand.
struct HttpServer::Exchange {
  std::shared_ptr<const Backend> backend;
  std::shared_ptr<Responder> responder;
  HttpHeaders headers;  // CORS, added to the response
  GenerationRequest request;
  std::unique_ptr<ResponseWriter> writer;
  std::string endpoint;
  uint64_t log_id = 0;
  Clock::time_point start = Clock::now();

  std::vector<engine::RequestId> engine_ids;
  std::unordered_map<engine::RequestId, size_t> prompt_of;
  std::vector<ChoiceState> choices;
  std::vector<size_t> stream_offsets;
  std::vector<bool> observed;  // the choice's finish is in the metrics
  size_t num_finished = 0;
  UsageTotals usage;
  std::optional<ApiError> error;
  std::optional<double> first_token_seconds;
  bool cancelled = false;
  bool ended = false;  // the response is complete (or the client is gone)
  bool logged = false;

  bool done() const { return error.has_value() || num_finished == choices.size(); }
  void cancel() {
    if (cancelled) return;
    cancelled = true;
    for (engine::RequestId id : engine_ids) backend->engine->cancel(id);
  }
  int32_t choice_index(const engine::RequestEvent& event) const {
    return static_cast<int32_t>(prompt_of.at(event.request_id) * request.params.n +
                                event.sample_idx);
  }
  // Stream chunks carry usage when the client asked for it.
  json with_usage(json chunk) const {
    if (request.continuous_usage) {
      chunk["usage"] = usage.to_json();
    } else if (request.include_usage) {
      chunk["usage"] = nullptr;
    }
    return chunk;
  }
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
    std::vector<std::shared_ptr<Exchange>> running;
    {
      std::lock_guard lock(exchanges_mutex_);
      for (auto& [raw, weak] : exchanges_) {
        if (auto ex = weak.lock()) running.push_back(std::move(ex));
      }
    }
    for (auto& ex : running) {
      ex->responder->post([this, ex] {
        if (ex->ended) return;
        ex->cancel();
        ex->error = ApiError{.status = 503,
                             .message = "the server shut down before the request finished",
                             .type = "server_unavailable"};
        complete_if_done(*ex);
      });
    }
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
                                 .body = dump(body),
                                 .headers = cors_headers(request)});
}

void HttpServer::send_error(const HttpRequest& request, Responder& responder,
                            const ApiError& error) {
  send(request, responder, error.status, error.to_json());
}

// Liveness: the process answers. 200 while draining too (restarting a draining replica would
// cut its running streams); 503 only while the model loads.
void HttpServer::serve_health(const HttpRequest& request, Responder& responder) {
  if (!backend()) return send(request, responder, 503, {{"status", "loading"}});
  send(request, responder, 200, {{"status", draining_ ? "draining" : "ok"}});
}

// Readiness: whether a balancer should send new requests here.
void HttpServer::serve_ready(const HttpRequest& request, Responder& responder) {
  if (!backend()) return send(request, responder, 503, {{"status", "loading"}});
  if (draining_) return send(request, responder, 503, {{"status", "draining"}});
  send(request, responder, 200, {{"status", "ready"}});
}

void HttpServer::serve_metrics(const HttpRequest& request, Responder& responder) {
  auto b = backend();
  if (!b) {
    return send_error(
        request, responder,
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
  responder.respond(std::move(response));
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

void HttpServer::route_probe(HttpRequest request, std::shared_ptr<Responder> responder) {
  if (request.method == "GET" && request.path == "/health") {
    return serve_health(request, *responder);
  }
  if (request.method == "GET" && request.path == "/ready") {
    return serve_ready(request, *responder);
  }
  if (request.method == "GET" && request.path == "/metrics") {
    return serve_metrics(request, *responder);
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
  if (request.path == "/health" || request.path == "/ready") {  // probes: no API key
    if (request.method != "GET") {
      return send_error(
          request, r,
          ApiError{.status = 405, .message = fmt::format("{} answers GET", request.path)});
    }
    return request.path == "/ready" ? serve_ready(request, r) : serve_health(request, r);
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
  auto b = backend();
  if (!b) {
    return send_error(
        request, r,
        ApiError{
            .status = 503, .message = "the model is still loading", .type = "server_unavailable"});
  }

  // Routes: method, path (a trailing '*' matches the rest), and whether the handler runs on a
  // handler thread (it parses a body) or at once.
  enum class Route {
    kMetrics,
    kModels,
    kModel,
    kKvState,
    kTokenize,
    kDetokenize,
    kCompletions,
    kChat
  };
  struct Entry {
    const char* method;
    std::string_view path;
    Route route;
  };
  static constexpr Entry kRoutes[] = {
      {"GET", "/metrics", Route::kMetrics},
      {"GET", "/v1/models", Route::kModels},
      {"GET", "/v1/models/*", Route::kModel},
      {"GET", "/v1/kv/state", Route::kKvState},
      {"POST", "/tokenize", Route::kTokenize},
      {"POST", "/detokenize", Route::kDetokenize},
      {"POST", "/v1/completions", Route::kCompletions},
      {"POST", "/v1/chat/completions", Route::kChat},
  };
  const Entry* found = nullptr;
  bool path_known = false;
  for (const Entry& e : kRoutes) {
    const bool prefix = e.path.ends_with('*');
    const std::string_view stem = prefix ? e.path.substr(0, e.path.size() - 1) : e.path;
    const bool match = prefix ? request.path.size() > stem.size() && request.path.starts_with(stem)
                              : request.path == stem;
    if (!match) continue;
    path_known = true;
    if (request.method == e.method) {
      found = &e;
      break;
    }
  }
  if (!found) {
    return send_error(
        request, r,
        ApiError{.status = path_known ? 405 : 404,
                 .message = fmt::format("no route {} {}", request.method, request.path),
                 .type = path_known ? "invalid_request_error" : "NotFoundError"});
  }
  switch (found->route) {
    case Route::kMetrics:
      return serve_metrics(request, r);
    case Route::kModels: {
      json cards = json::array({model_card(*b, b->model_name)});
      for (const std::string& alias : b->model_aliases) cards.push_back(model_card(*b, alias));
      return send(request, r, 200, {{"object", "list"}, {"data", std::move(cards)}});
    }
    case Route::kModel: {
      const std::string id = request.path.substr(std::string_view("/v1/models/").size());
      if (!serves_name(*b, id)) {
        return send_error(request, r,
                          ApiError{.status = 404,
                                   .message = fmt::format("The model `{}` does not exist.", id),
                                   .type = "NotFoundError",
                                   .param = "model",
                                   .code = "model_not_found"});
      }
      return send(request, r, 200, model_card(*b, id));
    }
    case Route::kKvState:
      return serve_kv_state(request, responder);
    default:
      break;
  }
  // The rest parse a body: off the I/O thread.
  boost::asio::post(workers_->pool, [this, route = found->route, request = std::move(request),
                                     responder = std::move(responder)] {
    try {
      switch (route) {
        case Route::kTokenize:
          return serve_tokenize(request, *responder);
        case Route::kDetokenize:
          return serve_detokenize(request, *responder);
        case Route::kCompletions:
          return handle_generation(ApiKind::kCompletion, request, responder);
        case Route::kChat:
          return handle_generation(ApiKind::kChat, request, responder);
        default:
          return;
      }
    } catch (const std::exception& e) {
      spdlog::error("unhandled error: {}", e.what());
      send_error(request, *responder,
                 ApiError{.status = 500, .message = e.what(), .type = "internal_server_error"});
    }
  });
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
                                          .body = dump(response.body),
                                          .headers = headers});
        });
      });
}

void HttpServer::serve_tokenize(const HttpRequest& request, Responder& responder) {
  ApiError error;
  auto body = parse_body(request, error);
  if (!body) return send_error(request, responder, error);
  auto b = backend();
  try {
    std::vector<TokenId> ids;
    if (body->contains("messages")) {
      ModelInfo info{.served_name = b->model_name,
                     .aliases = b->model_aliases,
                     .context_length = b->context_length,
                     .tokenizer = b->tokenizer.get(),
                     .render_chat = b->render_chat,
                     .grammars = b->grammars.get()};
      json chat = *body;
      chat["max_tokens"] = 1;  // tokenizing needs no room for a completion
      chat.erase("model");
      ids = parse_generation_request(ApiKind::kChat, chat, info).prompts.at(0);
    } else {
      auto it = body->find("prompt");
      if (it == body->end() || !it->is_string())
        throw_invalid("prompt", "'prompt' must be a string");
      bool add_special = true;
      if (auto a = body->find("add_special_tokens"); a != body->end() && !a->is_null()) {
        if (!a->is_boolean())
          throw_invalid("add_special_tokens", "'add_special_tokens' must be a boolean");
        add_special = a->get<bool>();
      }
      ids = b->tokenizer->encode(it->get<std::string>(),
                                 {.add_special = add_special, .parse_special = true});
    }
    send(request, responder, 200,
         {{"count", ids.size()}, {"max_model_len", b->context_length}, {"tokens", ids}});
  } catch (const ApiException& e) {
    send_error(request, responder, e.error());
  }
}

void HttpServer::serve_detokenize(const HttpRequest& request, Responder& responder) {
  ApiError error;
  auto body = parse_body(request, error);
  if (!body) return send_error(request, responder, error);
  auto b = backend();
  auto it = body->find("tokens");
  if (it == body->end() || !it->is_array()) {
    return send_error(
        request, responder,
        ApiError{
            .status = 400, .message = "'tokens' must be an array of token ids", .param = "tokens"});
  }
  std::vector<TokenId> ids;
  for (const json& v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() >= static_cast<int64_t>(b->tokenizer->vocab().size())) {
      return send_error(request, responder,
                        ApiError{.status = 400,
                                 .message = fmt::format("'tokens' must hold token ids in [0, {})",
                                                        b->tokenizer->vocab().size()),
                                 .param = "tokens"});
    }
    ids.push_back(static_cast<TokenId>(v.get<int64_t>()));
  }
  send(request, responder, 200, {{"prompt", b->tokenizer->decode(ids)}});
}

}  // namespace sieve::server

namespace sieve::server {

void HttpServer::apply(Exchange& ex, const engine::RequestEvent& event) {
  const int32_t index = ex.choice_index(event);
  ChoiceState& choice = ex.choices.at(index);
  if (choice.finish) return;  // a late event of a choice that has ended (e.g. after a cancel)
  if (event.error) {
    if (event.cancelled) {  // counted as an abort by finish_exchange
      choice.finish = engine::Finish{engine::FinishReason::kStop};
      ++ex.num_finished;
      return;
    }
    if (event.refused) {  // admission failed after submit(): the same answer as a refusal
      ex.error = admission_api_error(*event.refused);
    } else {
      ex.error = ApiError{.status = 500, .message = *event.error, .type = "internal_server_error"};
    }
    return;
  }
  if (ex.request.echo && !choice.echo) {  // the choice's first event: its prompt comes first
    choice.echo = Echo{.text = ex.request.echo_texts.at(ex.prompt_of.at(event.request_id)),
                       .logprobs = event.prompt_logprobs};
  }
  choice.text += event.text;
  choice.completion_tokens += static_cast<int32_t>(event.tokens.size());
  choice.logprobs.insert(choice.logprobs.end(), event.logprobs.begin(), event.logprobs.end());
  if (!event.tokens.empty() && !ex.first_token_seconds) {
    ex.first_token_seconds = std::chrono::duration<double>(Clock::now() - ex.start).count();
  }
  if (!event.finish) return;
  choice.finish = event.finish;
  ++ex.num_finished;
  ex.observed[index] = true;
  ex.usage.completion_tokens += event.usage.completion_tokens;
  ex.usage.kv_pages += event.usage.kv_pages;
  ex.usage.kv_dense_pages += event.usage.kv_dense_pages;
  ex.usage.kv_bytes += event.usage.kv_bytes;
  ex.usage.kv_dense_bytes += event.usage.kv_dense_bytes;
  ex.usage.spec_draft_tokens += event.usage.spec_draft_tokens;
  ex.usage.spec_accepted_tokens += event.usage.spec_accepted_tokens;
  if (event.usage.attention_recovery) {
    ex.usage.recovery_sum += *event.usage.attention_recovery;
    ++ex.usage.recovery_count;
  }
  if (event.sample_idx == 0) {  // the prompt is shared by the request's samples: count it once
    ex.usage.prompt_tokens += event.usage.prompt_tokens;
    ex.usage.cached_tokens += event.usage.cached_prompt_tokens;
  }
  SequenceRecord record{
      .finished_reason = std::string(engine::finish_reason_name(event.finish->reason)),
      .prompt_tokens = event.usage.prompt_tokens,
      .generation_tokens = event.usage.completion_tokens,
      .kv_pages = event.usage.kv_pages,
      .kv_dense_pages = event.usage.kv_dense_pages,
      .kv_bytes = event.usage.kv_bytes,
      .kv_dense_bytes = event.usage.kv_dense_bytes,
      .attention_recovery = event.usage.attention_recovery,
      .n = ex.request.params.n,
      .max_tokens = ex.request.params.max_tokens,
      .timings = event.timings};
  std::lock_guard lock(backend_mutex_);
  metrics_->observe(record);
}

void HttpServer::finish_exchange(Exchange& ex, std::string_view status) {
  if (ex.logged) return;
  ex.logged = true;
  {
    std::lock_guard lock(exchanges_mutex_);
    exchanges_.erase(&ex);
  }
  if (ex.cancelled) {
    // Sequences the client (or a shutdown) cut off count as vLLM's "abort".
    for (size_t i = 0; i < ex.choices.size(); ++i) {
      if (ex.observed[i]) continue;
      SequenceRecord record{.finished_reason = "abort",
                            .generation_tokens = ex.choices[i].completion_tokens,
                            .n = ex.request.params.n};
      std::lock_guard lock(backend_mutex_);
      metrics_->observe(record);
    }
  }
  const double total = std::chrono::duration<double>(Clock::now() - ex.start).count();
  spdlog::info(
      "request {} {} {} prompt_tokens={} output_tokens={} ttft={} total={:.3f}s{}", ex.log_id,
      ex.endpoint, status, ex.usage.prompt_tokens,
      [&] {
        int64_t n = 0;
        for (const ChoiceState& c : ex.choices) n += c.completion_tokens;
        return n;
      }(),
      ex.first_token_seconds ? fmt::format("{:.3f}s", *ex.first_token_seconds) : "-", total,
      ex.request.user.empty() ? "" : fmt::format(" user={}", ex.request.user));
  --active_requests_;
}

void HttpServer::handle_generation(ApiKind kind, const HttpRequest& http_request,
                                   std::shared_ptr<Responder> responder) {
  if (draining_) {
    return send_error(
        http_request, *responder,
        ApiError{
            .status = 503, .message = "the server is shutting down", .type = "server_unavailable"});
  }
  ApiError body_error;
  auto body = parse_body(http_request, body_error);
  if (!body) return send_error(http_request, *responder, body_error);
  auto ex = std::make_shared<Exchange>();
  ex->backend = backend();
  ex->responder = responder;
  ex->headers = cors_headers(http_request);
  ex->endpoint = kind == ApiKind::kChat ? "/v1/chat/completions" : "/v1/completions";
  ex->log_id = next_log_id_++;
  const Backend& b = *ex->backend;
  try {
    ModelInfo info{.served_name = b.model_name,
                   .aliases = b.model_aliases,
                   .context_length = b.context_length,
                   .tokenizer = b.tokenizer.get(),
                   .render_chat = b.render_chat,
                   .default_kv_policy = b.default_kv_policy,
                   .grammars = b.grammars.get(),
                   .tool_call_format = b.tool_call_format};
    ex->request = parse_generation_request(kind, *body, info);
  } catch (const ApiException& e) {
    spdlog::info("request {} {} {} {}", ex->log_id, ex->endpoint, e.error().status,
                 e.error().message);
    return send_error(http_request, *responder, e.error());
  }
  // Submitting and everything after run on the connection's strand, in order with the engine's
  // events for this exchange.
  responder->post([this, ex] { start_generation(ex); });
}

void HttpServer::start_generation(const std::shared_ptr<Exchange>& ex) {
  const Backend& b = *ex->backend;
  const GenerationRequest& request = ex->request;
  ex->writer =
      std::make_unique<ResponseWriter>(ex->request.kind, request.model, *b.tokenizer,
                                       request.params.logprobs.has_value(), request.tool_calls);
  ex->choices.resize(request.prompts.size() * request.params.n);
  if (request.stream && request.tool_calls.format != ToolCallFormat::kNone) {
    for (ChoiceState& choice : ex->choices) choice.tool_parser.emplace(request.tool_calls);
  }
  ex->stream_offsets.assign(ex->choices.size(), 0);
  ex->observed.assign(ex->choices.size(), false);
  ex->usage.speculative = request.speculative.value_or(b.engine->config().speculative).enabled();
  ++active_requests_;
  {
    std::lock_guard lock(exchanges_mutex_);
    exchanges_[ex.get()] = ex;
  }

  // The engine calls the sink on its own thread; it only posts the event to this strand.
  std::weak_ptr<Exchange> weak = ex;
  for (size_t i = 0; i < request.prompts.size(); ++i) {
    auto submitted = b.engine->submit(
        {.prompt = request.prompts[i],
         .params = request.params,
         .kv_policy = request.kv_policy,
         .speculative = request.speculative,
         .prompt_logprobs = request.prompt_logprobs,
         .label = {.id = ex->writer->id(),
                   .first_choice = static_cast<int32_t>(i) * request.params.n}},
        [this, weak, responder = ex->responder](const engine::RequestEvent& event) {
          responder->post([this, weak, event] {
            if (auto alive = weak.lock()) on_event(*alive, event);
          });
        });
    if (const auto* refusal = std::get_if<engine::AdmissionError>(&submitted)) {
      ex->cancel();
      ex->error = admission_api_error(*refusal);
      ex->responder->respond(HttpResponse{.status = ex->error->status,
                                          .content_type = kJsonType,
                                          .body = dump(ex->error->to_json()),
                                          .headers = ex->headers});
      ex->ended = true;
      return finish_exchange(*ex, std::to_string(ex->error->status));
    }
    const engine::RequestId id = std::get<engine::RequestId>(submitted);
    ex->engine_ids.push_back(id);
    ex->prompt_of[id] = i;
  }
  // Until the response ends the connection keeps the exchange alive (the engine's sink holds
  // only a weak pointer); a client that leaves cancels its requests. The abort callback holds
  // the exchange too: the client may have left already, and then nothing else does (the
  // connection drops the callback once the response ends).
  ex->responder->hold(ex);
  ex->responder->on_abort([this, ex] {
    if (ex->ended) return;
    ex->ended = true;
    ex->cancel();
    finish_exchange(*ex, "aborted (client disconnected)");
  });
  if (!request.stream) return;
  HttpResponse head{.status = 200, .content_type = "text/event-stream", .headers = ex->headers};
  head.headers.emplace_back("Cache-Control", "no-cache");
  head.headers.emplace_back("X-Accel-Buffering", "no");
  ex->responder->start_stream(std::move(head));
  if (request.kind == ApiKind::kChat) {
    std::string roles;
    for (size_t i = 0; i < ex->choices.size(); ++i) {
      roles += sse(ex->with_usage(ex->writer->role_chunk(static_cast<int32_t>(i))));
    }
    ex->responder->stream(std::move(roles));
  }
}

void HttpServer::on_event(Exchange& ex, const engine::RequestEvent& event) {
  if (ex.ended) return;
  apply(ex, event);
  const int32_t index = ex.choice_index(event);
  ChoiceState& choice = ex.choices.at(index);
  const Echo* echo = choice.echo && !choice.echo_sent ? &*choice.echo : nullptr;  // first chunk
  if (ex.request.stream && !ex.error && !event.error &&
      (echo || !(event.text.empty() && event.logprobs.empty() && !event.finish))) {
    // (else: text held back)
    if (choice.tool_parser) {  // chat with tools: the text goes through the tool-call parser
      std::string out;
      for (const json& chunk : ex.writer->tool_delta_chunks(
               choice, index, event.text, event.logprobs, event.finish, ex.stream_offsets[index])) {
        out += sse(ex.with_usage(chunk));
      }
      if (!out.empty()) ex.responder->stream(std::move(out));
    } else {
      const json chunk = ex.writer->delta_chunk(index, event.text, event.logprobs, event.finish,
                                                ex.stream_offsets[index], echo);
      choice.echo_sent = true;
      ex.responder->stream(sse(ex.with_usage(chunk)));
    }
  }
  complete_if_done(ex);
}

void HttpServer::complete_if_done(Exchange& ex) {
  if (ex.ended || !ex.done()) return;
  ex.ended = true;
  if (!ex.request.stream) {
    const int status = ex.error ? ex.error->status : 200;
    const json body = ex.error ? ex.error->to_json() : ex.writer->response(ex.choices, ex.usage);
    ex.responder->respond(HttpResponse{
        .status = status, .content_type = kJsonType, .body = dump(body), .headers = ex.headers});
    return finish_exchange(ex, std::to_string(status));
  }
  std::string tail;
  if (ex.error) {
    tail += sse(ex.error->to_json());
  } else if (ex.request.include_usage) {
    tail += sse(ex.writer->usage_chunk(ex.usage));
  }
  tail += "data: [DONE]\n\n";
  ex.responder->stream(std::move(tail));
  ex.responder->end_stream();
  finish_exchange(ex, ex.error ? std::to_string(ex.error->status) : "200");
}

}  // namespace sieve::server
