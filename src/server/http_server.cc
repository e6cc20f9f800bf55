#include "server/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fmt/format.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <thread>
#include <unordered_map>

#include "util/error.h"

namespace sieve::server {

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kJsonType = "application/json";
// How long an HTTP thread waits for engine events before it looks at the client's socket.
constexpr auto kPollInterval = std::chrono::milliseconds(50);

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), kJsonType);
}

void send_error(httplib::Response& res, const ApiError& error) {
  send_json(res, error.status, error.to_json());
}

std::string numeric_host(const sockaddr_storage& addr, socklen_t len) {
  char host[NI_MAXHOST] = {};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), nullptr, 0,
                  NI_NUMERICHOST) != 0) {
    return {};
  }
  return host;
}

int port_of(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(addr).sin_port);
  if (addr.ss_family == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6&>(addr).sin6_port);
  return -1;
}

// Calls fn(fd, local address) for each socket of this process until fn returns true.
template <typename Fn>
void for_each_socket(Fn fn) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;
    if (fn(static_cast<int>(fd), local)) break;
  }
  closedir(dir);
}

// cpp-httplib 0.11 does not hand the connection's socket to handlers, and a write to a socket
// whose peer has gone only fails on the second try. To cancel a request as soon as its client
// disconnects (also while it waits in the queue, writing nothing), find the accepted socket by
// its two endpoints and watch it for hang-up. -1 when not found (then write failures still end
// the request).
int find_client_socket(const httplib::Request& req) {
  int found = -1;
  for_each_socket([&](int fd, const sockaddr_storage& local) {
    if (port_of(local) != req.local_port) return false;
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;
    if (port_of(peer) != req.remote_port || numeric_host(peer, peer_len) != req.remote_addr)
      return false;
    found = fd;
    return true;
  });
  return found;
}

// cpp-httplib 0.11 listens with a backlog of 5: a burst of new connections beyond that is
// dropped, and TCP retries it a second later (a 1 s TTFT outlier). Listening again on the bound
// socket raises the backlog.
void raise_listen_backlog(int port) {
  for_each_socket([&](int fd, const sockaddr_storage& local) {
    int listening = 0;
    socklen_t flag_len = sizeof(listening);
    if (port_of(local) == port &&
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &flag_len) == 0 && listening) {
      ::listen(fd, SOMAXCONN);
    }
    return false;
  });
}

// True when the client closed its side (or the connection broke). Does not consume data.
bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{.fd = fd, .events = POLLRDHUP, .revents = 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

std::optional<json> parse_body(const httplib::Request& req, httplib::Response& res) {
  json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    send_error(res, ApiError{.status = 400,
                             .message = "the request body is not valid JSON (UTF-8)",
                             .param = "body"});
    return std::nullopt;
  }
  if (!body.is_object()) {
    send_error(res, ApiError{.status = 400,
                             .message = "the request body must be a JSON object",
                             .param = "body"});
    return std::nullopt;
  }
  return body;
}

}  // namespace

// One generation request: its engine requests, the events the engine pushed for it, and what
// its choices have produced so far.
struct HttpServer::Exchange {
  std::shared_ptr<const Backend> backend;
  GenerationRequest request;
  std::unique_ptr<ResponseWriter> writer;
  std::string endpoint;
  uint64_t log_id = 0;
  Clock::time_point start = Clock::now();
  int client_fd = -1;

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
  bool stream_started = false;
  bool logged = false;

  std::mutex mutex;
  std::condition_variable cv;
  std::deque<engine::RequestEvent> queue;

  void push(const engine::RequestEvent& event) {
    {
      std::lock_guard lock(mutex);
      queue.push_back(event);
    }
    cv.notify_one();
  }
  std::deque<engine::RequestEvent> take() {
    std::unique_lock lock(mutex);
    cv.wait_for(lock, kPollInterval, [&] { return !queue.empty(); });
    std::deque<engine::RequestEvent> events;
    events.swap(queue);
    return events;
  }
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
};

HttpServer::HttpServer(ServerConfig config)
    : config_(std::move(config)), http_(std::make_unique<httplib::Server>()) {
  install_routes();
}

HttpServer::~HttpServer() = default;

std::shared_ptr<const Backend> HttpServer::backend() const {
  std::lock_guard lock(backend_mutex_);
  return backend_;
}

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
  // Streams hold their HTTP thread for their whole life: have one for every sequence that can
  // run or wait, plus some for health checks and metrics scrapes.
  const int threads = config_.http_threads > 0 ? config_.http_threads : 256;
  http_->new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<size_t>(threads));
  };
  http_->set_payload_max_length(config_.max_body_bytes);
  http_->set_tcp_nodelay(true);  // stream chunks are small: send each at once (no Nagle delay)
  http_->set_keep_alive_timeout(5);
  http_->set_read_timeout(30);
  http_->set_write_timeout(30);
  if (config_.port == 0) {
    bound_port_ = http_->bind_to_any_port(config_.host);
    if (bound_port_ < 0) fail("cannot bind to {} on any port", config_.host);
  } else {
    if (!http_->bind_to_port(config_.host, config_.port)) {
      fail("cannot bind to {}:{} (in use, or not an address of this machine)", config_.host,
           config_.port);
    }
    bound_port_ = config_.port;
  }
  raise_listen_backlog(bound_port_);
  bound_ = true;
}

void HttpServer::listen() { http_->listen_after_bind(); }

void HttpServer::shutdown() {
  draining_ = true;
  const auto deadline = Clock::now() + config_.shutdown_grace;
  while (active_requests_.load() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (active_requests_.load() > 0) {
    spdlog::warn("shutdown: cancelling {} request(s) still running after the grace period",
                 active_requests_.load());
    cancel_all_ = true;
    const auto hard_deadline = Clock::now() + std::chrono::seconds(5);
    while (active_requests_.load() > 0 && Clock::now() < hard_deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  // stop() only closes a running server's socket: when shutdown comes right after start (a bad
  // option found while loading), let listen() (which follows bind() on its own thread) get going
  // first, or the stop would be lost and listen() would block for ever.
  const auto listen_deadline = Clock::now() + std::chrono::seconds(5);
  while (bound_ && !http_->is_running() && Clock::now() < listen_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  http_->stop();
}

void HttpServer::install_routes() {
  httplib::Server& http = *http_;

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (!config_.api_key.empty()) {
      const std::string auth = req.get_header_value("Authorization");
      if (auth != "Bearer " + config_.api_key) {
        send_error(
            res,
            ApiError{.status = 401,
                     .message = auth.empty() ? "missing API key: send 'Authorization: Bearer KEY'"
                                             : "invalid API key",
                     .type = "authentication_error",
                     .code = "invalid_api_key"});
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (!backend()) {
      send_error(res, ApiError{.status = 503,
                               .message = "the model is still loading",
                               .type = "server_unavailable"});
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // Errors cpp-httplib produces itself (unknown route, body too large, unreadable request)
  // get the same JSON shape as ours; responses that already have a body are left alone.
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req,
                                                                 httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError error{.status = res.status,
                   .message = fmt::format("the request failed with HTTP status {}", res.status)};
    if (res.status == 404) {
      error.message = fmt::format("no route {} {}", req.method, req.path);
      error.type = "NotFoundError";
    } else if (res.status == 413) {
      error.message = "the request body is larger than the server accepts";
      error.param = "body";
    }
    send_error(res, error);
    return httplib::Server::HandlerResponse::Handled;
  }));

  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        spdlog::error("unhandled error: {}", what);
        send_error(res, ApiError{.status = 500, .message = what, .type = "internal_server_error"});
      });

  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (!backend()) return send_json(res, 503, {{"status", "loading"}});
    if (draining_) return send_json(res, 503, {{"status", "shutting down"}});
    send_json(res, 200, {{"status", "ok"}});
  });

  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    auto b = backend();
    std::string text;
    {
      std::lock_guard lock(backend_mutex_);
      text = metrics_->render(b->engine->stats());
    }
    res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
  });

  auto model_card = [](const Backend& b) {
    return json{{"id", b.model_name},
                {"object", "model"},
                {"created", std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count()},
                {"owned_by", "sieve"},
                {"root", b.model_name},
                {"parent", nullptr},
                {"max_model_len", b.context_length}};
  };
  http.Get("/v1/models", [this, model_card](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"object", "list"}, {"data", json::array({model_card(*backend())})}});
  });
  http.Get(R"(/v1/models/(.+))", [this, model_card](const httplib::Request& req,
                                                    httplib::Response& res) {
    auto b = backend();
    if (req.matches[1] != b->model_name) {
      return send_error(res, ApiError{.status = 404,
                                      .message = fmt::format("The model `{}` does not exist.",
                                                             req.matches[1].str()),
                                      .type = "NotFoundError",
                                      .param = "model",
                                      .code = "model_not_found"});
    }
    send_json(res, 200, model_card(*b));
  });

  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    auto body = parse_body(req, res);
    if (!body) return;
    auto b = backend();
    try {
      std::vector<TokenId> ids;
      if (body->contains("messages")) {
        ModelInfo info{.served_name = b->model_name,
                       .context_length = b->context_length,
                       .tokenizer = b->tokenizer.get(),
                       .render_chat = b->render_chat};
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
      send_json(res, 200,
                {{"count", ids.size()}, {"max_model_len", b->context_length}, {"tokens", ids}});
    } catch (const ApiException& e) {
      send_error(res, e.error());
    }
  });

  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    auto body = parse_body(req, res);
    if (!body) return;
    auto b = backend();
    auto it = body->find("tokens");
    if (it == body->end() || !it->is_array()) {
      return send_error(res, ApiError{.status = 400,
                                      .message = "'tokens' must be an array of token ids",
                                      .param = "tokens"});
    }
    std::vector<TokenId> ids;
    for (const json& v : *it) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
          v.get<int64_t>() >= static_cast<int64_t>(b->tokenizer->vocab().size())) {
        return send_error(res,
                          ApiError{.status = 400,
                                   .message = fmt::format("'tokens' must hold token ids in [0, {})",
                                                          b->tokenizer->vocab().size()),
                                   .param = "tokens"});
      }
      ids.push_back(static_cast<TokenId>(v.get<int64_t>()));
    }
    send_json(res, 200, {{"prompt", b->tokenizer->decode(ids)}});
  });

  auto generate = [this](ApiKind kind) {
    return [this, kind](const httplib::Request& req, httplib::Response& res) {
      handle_generation(kind, req, res);
    };
  };
  http.Post("/v1/completions", generate(ApiKind::kCompletion));
  http.Post("/v1/chat/completions", generate(ApiKind::kChat));
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

void HttpServer::handle_generation(ApiKind kind, const httplib::Request& req,
                                   httplib::Response& res) {
  if (draining_) {
    return send_error(res, ApiError{.status = 503,
                                    .message = "the server is shutting down",
                                    .type = "server_unavailable"});
  }
  auto body = parse_body(req, res);
  if (!body) return;
  auto ex = std::make_shared<Exchange>();
  ex->backend = backend();
  ex->endpoint = kind == ApiKind::kChat ? "/v1/chat/completions" : "/v1/completions";
  ex->log_id = next_log_id_++;
  const Backend& b = *ex->backend;
  try {
    ModelInfo info{.served_name = b.model_name,
                   .context_length = b.context_length,
                   .tokenizer = b.tokenizer.get(),
                   .render_chat = b.render_chat,
                   .default_kv_policy = b.default_kv_policy};
    ex->request = parse_generation_request(kind, *body, info);
  } catch (const ApiException& e) {
    spdlog::info("request {} {} {} {}", ex->log_id, ex->endpoint, e.error().status,
                 e.error().message);
    return send_error(res, e.error());
  }
  const GenerationRequest& request = ex->request;
  ex->writer = std::make_unique<ResponseWriter>(kind, b.model_name, *b.tokenizer,
                                                request.params.logprobs.has_value());
  ex->choices.resize(request.prompts.size() * request.params.n);
  ex->stream_offsets.assign(ex->choices.size(), 0);
  ex->observed.assign(ex->choices.size(), false);
  ex->usage.speculative = request.speculative.value_or(b.engine->config().speculative).enabled();
  ex->client_fd = find_client_socket(req);
  ++active_requests_;

  // Submit every prompt; the engine calls the sink on its own thread, which only queues.
  for (size_t i = 0; i < request.prompts.size(); ++i) {
    std::weak_ptr<Exchange> weak = ex;
    auto submitted = b.engine->submit({.prompt = request.prompts[i],
                                       .params = request.params,
                                       .kv_policy = request.kv_policy,
                                       .speculative = request.speculative},
                                      [weak](const engine::RequestEvent& event) {
                                        if (auto alive = weak.lock()) alive->push(event);
                                      });
    if (const auto* refusal = std::get_if<engine::AdmissionError>(&submitted)) {
      ex->cancel();
      const ApiError error = admission_api_error(*refusal);
      finish_exchange(*ex, std::to_string(error.status));
      return send_error(res, error);
    }
    // Events of this id may already be queued; they are applied only after this loop.
    const engine::RequestId id = std::get<engine::RequestId>(submitted);
    ex->engine_ids.push_back(id);
    ex->prompt_of[id] = i;
  }

  if (!request.stream) {
    while (!ex->done()) {
      std::deque<engine::RequestEvent> events = ex->take();
      for (const auto& event : events) apply(*ex, event);
      if (ex->done()) break;
      if (peer_closed(ex->client_fd)) {
        ex->cancel();
        return finish_exchange(*ex, "aborted (client disconnected)");
      }
      if (cancel_all_ && !ex->cancelled) {
        ex->cancel();
        ex->error = ApiError{.status = 503,
                             .message = "the server shut down before the request finished",
                             .type = "server_unavailable"};
      }
    }
    if (ex->error) {
      finish_exchange(*ex, std::to_string(ex->error->status));
      return send_error(res, *ex->error);
    }
    send_json(res, 200, ex->writer->response(ex->choices, ex->usage));
    return finish_exchange(*ex, "200");
  }

  // Streaming: the content provider runs on this HTTP thread after the handler returns, once
  // per call until done(); returning false drops the connection.
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, ex](size_t, httplib::DataSink& sink) {
        auto write = [&](const json& chunk) {
          const std::string line = "data: " + dump(chunk) + "\n\n";
          return sink.write(line.data(), line.size());
        };
        auto write_done = [&] {
          static constexpr std::string_view kDone = "data: [DONE]\n\n";
          sink.write(kDone.data(), kDone.size());
          sink.done();
        };
        const GenerationRequest& request = ex->request;
        auto with_usage = [&](json chunk) {
          if (request.continuous_usage) {
            chunk["usage"] = ex->usage.to_json();
          } else if (request.include_usage) {
            chunk["usage"] = nullptr;
          }
          return chunk;
        };
        if (!ex->stream_started) {
          ex->stream_started = true;
          if (request.kind == ApiKind::kChat) {
            for (size_t i = 0; i < ex->choices.size(); ++i) {
              if (!write(with_usage(ex->writer->role_chunk(static_cast<int32_t>(i))))) return false;
            }
          }
        }
        std::deque<engine::RequestEvent> events = ex->take();
        for (const auto& event : events) {
          apply(*ex, event);
          if (ex->error || event.error) continue;
          if (event.text.empty() && event.logprobs.empty() && !event.finish)
            continue;  // text held back
          const int32_t index = ex->choice_index(event);
          const json chunk = ex->writer->delta_chunk(index, event.text, event.logprobs,
                                                     event.finish, ex->stream_offsets[index]);
          if (!write(with_usage(chunk))) return false;
        }
        if (ex->error) {
          write(ex->error->to_json());
          write_done();
          return true;
        }
        if (ex->done()) {
          if (request.include_usage) write(ex->writer->usage_chunk(ex->usage));
          write_done();
          return true;
        }
        if (cancel_all_) {
          ex->cancel();
          ex->error = ApiError{.status = 503,
                               .message = "the server shut down before the request finished",
                               .type = "server_unavailable"};
        }
        return !peer_closed(ex->client_fd);
      },
      [this, ex](bool success) {
        if (!ex->done() || !success) {
          ex->cancel();
          return finish_exchange(*ex, "aborted (client disconnected)");
        }
        finish_exchange(*ex, ex->error ? std::to_string(ex->error->status) : "200");
      });
}

}  // namespace sieve::server
