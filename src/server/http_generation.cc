// Completions and chat completions: one Exchange per request, from its parsed body to the end
// of its response (see http_server.h for the threads).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "server/http_server.h"

namespace sieve::server {

namespace {

using Clock = std::chrono::steady_clock;

std::string sse(const json& chunk) { return "data: " + dump_json(chunk) + "\n\n"; }

}  // namespace

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

void HttpServer::cancel_exchanges() {
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
}

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
  choice.tokens.insert(choice.tokens.end(), event.tokens.begin(), event.tokens.end());
  choice.completion_tokens += static_cast<int32_t>(event.tokens.size());
  choice.logprobs.insert(choice.logprobs.end(), event.logprobs.begin(), event.logprobs.end());
  if (!event.tokens.empty() && !ex.first_token_seconds) {
    ex.first_token_seconds = std::chrono::duration<double>(Clock::now() - ex.start).count();
  }
  if (!event.finish) return;
  choice.finish = event.finish;
  ++ex.num_finished;
  if (ex.backend->answers) {
    const size_t prompt = ex.prompt_of.at(event.request_id);
    if (prompt < ex.request.prompt_texts.size() && !ex.request.prompt_texts[prompt].empty()) {
      ex.backend->answers->remember(ex.request.prompt_texts[prompt], ex.request.prompts.at(prompt),
                                    choice.tokens, ex.request.prompt_encoding, choice.text);
    }
  }
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
    ex.usage.continued_tokens += event.usage.continued_prompt_tokens;
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
                                   const std::shared_ptr<Responder>& responder) {
  if (draining_) {
    return send_error(
        http_request, *responder,
        ApiError{
            .status = 503, .message = "the server is shutting down", .type = "server_unavailable"});
  }
  const json body = parse_request_body(http_request.body);
  auto ex = std::make_shared<Exchange>();
  ex->backend = backend();
  ex->responder = responder;
  ex->headers = cors_headers(http_request);
  ex->endpoint = kind == ApiKind::kChat ? "/v1/chat/completions" : "/v1/completions";
  ex->log_id = next_log_id_++;
  const Backend& b = *ex->backend;
  try {
    ex->request = parse_generation_request(kind, body, b.model_info());
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
                                          .body = dump_json(ex->error->to_json()),
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
    ex.responder->respond(HttpResponse{.status = status,
                                       .content_type = kJsonType,
                                       .body = dump_json(body),
                                       .headers = ex.headers});
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
