#include "server/http_transport.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "util/error.h"

namespace sieve::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// A connection over max_connections only gets this long to send its (reserved-path) request.
constexpr std::chrono::milliseconds kLimitedRequestTimeout{2000};
// After an error response with Connection: close, read (and drop) what the client still sends
// for this long before closing, so that our response is not lost to a reset.
constexpr std::chrono::milliseconds kLingerTimeout{2000};

std::string_view view(beast::string_view s) { return {s.data(), s.size()}; }

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string reason(int status) {
  const std::string_view text = view(http::obsolete_reason(static_cast<http::status>(status)));
  return text.empty() || text == "<unknown-status>" ? std::string("Status") : std::string(text);
}

std::string format_head(int version, int status, const HttpHeaders& headers) {
  std::string head =
      fmt::format("HTTP/{} {} {}\r\n", version == 10 ? "1.0" : "1.1", status, reason(status));
  for (const auto& [name, value] : headers) head += fmt::format("{}: {}\r\n", name, value);
  head += "\r\n";
  return head;
}

}  // namespace

std::string HttpRequest::header(std::string_view name) const {
  const std::string key = lower(name);
  for (const auto& [n, v] : headers) {
    if (n == key) return v;
  }
  return {};
}

struct HttpTransport::State {
  HttpLimits limits;
  HttpHandler handler;
  std::vector<std::string> reserved_paths;
  HttpErrorBody error_body;
  net::io_context ioc;
  net::strand<net::io_context::executor_type> accept_strand{net::make_strand(ioc)};
  tcp::acceptor acceptor{accept_strand};
  net::steady_timer accept_retry{accept_strand};

  std::atomic<int64_t> open{0};
  std::atomic<int64_t> refused{0};
  std::atomic<int64_t> limited{0};
  std::atomic<int64_t> timed_out{0};
  std::atomic<int64_t> malformed{0};
  std::atomic<int64_t> aborted{0};
  std::atomic<int64_t> writing{0};  // connections with a write in flight
  std::atomic<bool> stopped{false};
  Clock::time_point last_accept_error{};

  std::mutex registry_mutex;
  std::unordered_map<HttpConnection*, std::weak_ptr<HttpConnection>> registry;

  bool reserved(const std::string& path) const {
    return std::find(reserved_paths.begin(), reserved_paths.end(), path) != reserved_paths.end();
  }
  void accept();
};

// One client connection. Everything below runs on the connection's strand.
class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(tcp::socket socket, HttpTransport::State& state, bool limited)
      : stream_(std::move(socket)), state_(state), limited_(limited), accepted_(Clock::now()) {}

  net::any_io_executor executor() { return stream_.get_executor(); }

  void start() { read_request(); }

  // Responder operations; `serial` names the request they belong to.
  void respond(uint64_t serial, HttpResponse response) {
    if (!current(serial) || streaming_) return;
    response_ended_ = true;
    out_pending_ += format_response(response);
    flush();
  }
  void start_stream(uint64_t serial, HttpResponse head) {
    if (!current(serial) || streaming_) return;
    streaming_ = true;
    chunked_ = version_ == 11;
    if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the body ends when the connection does
    head.headers.emplace_back("Content-Type", head.content_type);
    if (chunked_) head.headers.emplace_back("Transfer-Encoding", "chunked");
    head.headers.emplace_back("Connection", keep_alive_ ? "keep-alive" : "close");
    out_pending_ += format_head(version_, head.status, head.headers);
    flush();
  }
  void stream(uint64_t serial, const std::string& data) {
    if (!current(serial) || !streaming_ || data.empty()) return;
    if (chunked_) {
      out_pending_ += fmt::format("{:x}\r\n", data.size());
      out_pending_ += data;
      out_pending_ += "\r\n";
    } else {
      out_pending_ += data;
    }
    if (out_pending_.size() > state_.limits.max_stream_buffer_bytes) {
      // The client stopped reading: stop generating for it instead of buffering without end.
      spdlog::warn("closing a stream whose client fell {} bytes behind", out_pending_.size());
      return close();
    }
    flush();
  }
  void end_stream(uint64_t serial) {
    if (!current(serial) || !streaming_) return;
    if (chunked_) out_pending_ += "0\r\n\r\n";
    response_ended_ = true;
    flush();
  }
  void on_abort(uint64_t serial, std::function<void()> fn) {
    if (current(serial)) {
      abort_fn_ = std::move(fn);
    } else if (serial == aborted_serial_) {
      fn();  // the client left before the handler asked to hear of it
    }
  }
  void hold(uint64_t serial, std::shared_ptr<void> owner) {
    if (current(serial)) held_ = std::move(owner);
  }

  // Closes the socket; a response in progress is aborted (its on_abort callback runs).
  void close() {
    if (closed_) return;
    closed_ = true;
    abort_exchange();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    --state_.open;
    std::lock_guard lock(state_.registry_mutex);
    state_.registry.erase(this);
  }

  // At destruction of the transport (no thread runs the event loop any more): drop everything,
  // calling nothing back.
  void drop() {
    abort_fn_ = nullptr;
    held_.reset();
    if (closed_) return;
    closed_ = true;
    stream_.close();
    --state_.open;
  }

 private:
  bool current(uint64_t serial) const {
    return !closed_ && in_exchange_ && serial == serial_ && !response_ended_;
  }

  void read_request() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(state_.limits.max_header_bytes));
    parser_->body_limit(state_.limits.max_body_bytes);
    if (limited_) {
      deadline_ = accepted_ + std::min(state_.limits.request_timeout,
                                       std::chrono::milliseconds(kLimitedRequestTimeout));
      return read_header();
    }
    if (num_served_ == 0) {
      deadline_ = accepted_ + state_.limits.request_timeout;
      return read_header();
    }
    if (buffer_.size() > 0) {  // a pipelined request is already here
      deadline_ = Clock::now() + state_.limits.request_timeout;
      return read_header();
    }
    // Keep-alive: wait for the next request's first bytes, then give it request_timeout.
    stream_.expires_after(state_.limits.keep_alive_timeout);
    stream_.async_read_some(
        buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
          if (ec) return self->close();  // idle keep-alive connection timed out or closed
          self->buffer_.commit(n);
          self->deadline_ = Clock::now() + self->state_.limits.request_timeout;
          self->read_header();
        });
  }

  void read_header() {
    stream_.expires_at(deadline_);
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) return fail_read(ec);
    const auto& message = parser_->get();
    const size_t num_fields = static_cast<size_t>(std::distance(message.begin(), message.end()));
    if (num_fields > state_.limits.max_header_count) {
      return refuse(431, fmt::format("the request has {} header lines; the server accepts {}",
                                     num_fields, state_.limits.max_header_count));
    }
    if (message.target().empty() || message.target()[0] != '/') {
      return refuse(400, "the request target must be a path starting with '/'");
    }
    if (parser_->is_done()) return dispatch();
    if (beast::iequals(message[http::field::expect], "100-continue")) {
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      stream_.expires_at(deadline_);
      return net::async_write(stream_, net::buffer(kContinue.data(), kContinue.size()),
                              [self = shared_from_this()](beast::error_code write_ec, size_t) {
                                if (write_ec) return self->close();
                                self->read_body();
                              });
    }
    read_body();
  }

  void read_body() {
    stream_.expires_at(deadline_);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return self->fail_read(ec);
                       self->dispatch();
                     });
  }

  void fail_read(beast::error_code ec) {
    if (ec == beast::error::timeout) {
      // The stream has closed the socket already; there is nobody to answer.
      if (parser_ && parser_->got_some()) ++state_.timed_out;
      return close();
    }
    if (ec == http::error::header_limit) {
      return refuse(431, fmt::format("the request line and headers exceed {} bytes",
                                     state_.limits.max_header_bytes));
    }
    if (ec == http::error::body_limit) {
      return refuse(413, "the request body is larger than the server accepts");
    }
    if (ec == http::error::end_of_stream || ec == http::error::partial_message ||
        ec == net::error::eof || ec == net::error::connection_reset ||
        ec == net::error::operation_aborted || ec == net::error::broken_pipe) {
      return close();  // the client went away (or closed between requests)
    }
    if (ec.category() == http::make_error_code(http::error::bad_method).category()) {
      return refuse(400, fmt::format("malformed HTTP request: {}", ec.message()));
    }
    close();
  }

  // An error response, then close: the request cannot be read further.
  void refuse(int status, std::string message) {
    ++state_.malformed;
    keep_alive_ = false;
    begin_exchange();
    respond(serial_, error_response(status, message));
  }

  void begin_exchange() {
    stream_.expires_never();
    ++serial_;
    in_exchange_ = true;
    response_ended_ = false;
    streaming_ = false;
    abort_fn_ = nullptr;
    held_.reset();
  }

  void dispatch() {
    auto& message = parser_->get();
    version_ = message.version() == 10 ? 10 : 11;
    keep_alive_ = message.keep_alive() && !limited_;
    HttpRequest request;
    request.method = std::string(view(message.method_string()));
    const std::string_view target = view(message.target());
    const size_t question = target.find('?');
    request.path = std::string(target.substr(0, question));
    if (question != std::string_view::npos)
      request.query = std::string(target.substr(question + 1));
    for (const auto& field : message) {
      request.headers.emplace_back(lower(view(field.name_string())),
                                   std::string(view(field.value())));
    }
    request.body = std::move(message.body());
    request.version = version_;
    begin_exchange();
    if (limited_ && !state_.reserved(request.path)) {
      ++state_.limited;
      HttpResponse response =
          error_response(503, "the server has too many open connections; retry later");
      response.headers.emplace_back("Retry-After", "1");
      return respond(serial_, std::move(response));
    }
    watch_for_close();
    auto responder = std::make_shared<Responder>(shared_from_this(), serial_);
    try {
      state_.handler(std::move(request), responder);
    } catch (const std::exception& e) {
      spdlog::error("unhandled error in a request handler: {}", e.what());
      respond(serial_, error_response(500, e.what()));
    }
  }

  // While a handler works on the request, notice a client that hangs up (so its generation is
  // cancelled at once, also while it waits in the queue and nothing is written).
  void watch_for_close() {
    if (watching_ || closed_) return;
    watching_ = true;
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(),
                                                         serial = serial_](beast::error_code ec) {
      self->watching_ = false;
      if (ec || !self->current(serial)) return;
      char byte = 0;
      const ssize_t got =
          ::recv(self->stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        return self->close();  // hung up: abort the request
      }
      if (got < 0) return self->watch_for_close();
      // got > 0: the next pipelined request is already arriving; it waits in the socket until
      // this response is done (a closed client then shows as a failed write).
    });
  }

  HttpResponse error_response(int status, const std::string& message) const {
    HttpResponse response;
    response.status = status;
    response.body = state_.error_body(status, message);
    return response;
  }

  std::string format_response(HttpResponse& response) {
    response.headers.emplace_back("Content-Type", response.content_type);
    response.headers.emplace_back("Content-Length", std::to_string(response.body.size()));
    response.headers.emplace_back("Connection", keep_alive_ ? "keep-alive" : "close");
    std::string text = format_head(version_, response.status, response.headers);
    text += response.body;
    return text;
  }

  void flush() {
    if (writing_ || closed_) return;
    if (out_pending_.empty()) {
      if (response_ended_ && in_exchange_) finish_response();
      return;
    }
    writing_ = true;
    ++state_.writing;
    out_inflight_.swap(out_pending_);
    out_pending_.clear();
    stream_.expires_after(state_.limits.write_timeout);
    net::async_write(stream_, net::buffer(out_inflight_),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->writing_ = false;
                       --self->state_.writing;
                       self->out_inflight_.clear();
                       if (ec) return self->close();
                       self->flush();
                     });
  }

  void finish_response() {
    in_exchange_ = false;
    abort_fn_ = nullptr;
    held_.reset();
    streaming_ = false;
    ++num_served_;
    stream_.expires_never();
    if (!keep_alive_) return linger_close();
    read_request();
  }

  // Half-close, then drain what the client still sends until it closes too (or kLingerTimeout),
  // so an error response sent before the whole body was read reaches the client.
  void linger_close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(kLingerTimeout);
    drain();
  }
  void drain() {
    stream_.async_read_some(net::buffer(drain_buffer_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->close();
                              self->drain();
                            });
  }

  void abort_exchange() {
    if (!in_exchange_ || response_ended_) return;
    in_exchange_ = false;
    aborted_serial_ = serial_;
    ++state_.aborted;
    auto fn = std::move(abort_fn_);
    abort_fn_ = nullptr;
    if (fn) fn();
    held_.reset();
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  HttpTransport::State& state_;
  const bool limited_;
  const Clock::time_point accepted_;
  Clock::time_point deadline_;
  std::optional<http::request_parser<http::string_body>> parser_;

  int version_ = 11;
  bool keep_alive_ = true;
  uint64_t serial_ = 0;
  uint64_t aborted_serial_ = 0;
  uint64_t num_served_ = 0;
  bool in_exchange_ = false;
  bool response_ended_ = false;
  bool streaming_ = false;
  bool chunked_ = false;
  bool writing_ = false;
  bool watching_ = false;
  bool closed_ = false;
  std::function<void()> abort_fn_;
  std::shared_ptr<void> held_;
  std::string out_pending_;
  std::string out_inflight_;
  std::array<char, 4096> drain_buffer_{};
};

Responder::Responder(std::shared_ptr<HttpConnection> connection, uint64_t serial)
    : connection_(std::move(connection)), serial_(serial) {}

void Responder::respond(HttpResponse response) {
  net::post(connection_->executor(),
            [c = connection_, s = serial_, r = std::move(response)]() mutable {
              c->respond(s, std::move(r));
            });
}
void Responder::start_stream(HttpResponse head) {
  net::post(connection_->executor(), [c = connection_, s = serial_, h = std::move(head)]() mutable {
    c->start_stream(s, std::move(h));
  });
}
void Responder::stream(std::string data) {
  net::post(connection_->executor(),
            [c = connection_, s = serial_, d = std::move(data)] { c->stream(s, d); });
}
void Responder::end_stream() {
  net::post(connection_->executor(), [c = connection_, s = serial_] { c->end_stream(s); });
}
void Responder::on_abort(std::function<void()> fn) {
  net::post(connection_->executor(), [c = connection_, s = serial_, f = std::move(fn)]() mutable {
    c->on_abort(s, std::move(f));
  });
}
void Responder::hold(std::shared_ptr<void> owner) {
  net::post(
      connection_->executor(),
      [c = connection_, s = serial_, o = std::move(owner)]() mutable { c->hold(s, std::move(o)); });
}
void Responder::post(std::function<void()> fn) {
  net::post(connection_->executor(), std::move(fn));
}

void HttpTransport::State::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (!acceptor.is_open()) return;
    if (ec) {
      // Typically out of file descriptors: try again shortly instead of spinning.
      const auto now = Clock::now();
      if (now - last_accept_error > std::chrono::seconds(1)) {
        spdlog::warn("accept failed: {} ({} connections open)", ec.message(), open.load());
        last_accept_error = now;
      }
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](beast::error_code) { accept(); });
      return;
    }
    const int64_t num_open = open.load();
    if (num_open >= static_cast<int64_t>(limits.max_connections + limits.reserved_connections)) {
      ++refused;
      beast::error_code ignored;
      socket.close(ignored);
    } else {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);  // stream chunks are small: no Nagle delay
      ++open;
      auto connection = std::make_shared<HttpConnection>(
          std::move(socket), *this, num_open >= static_cast<int64_t>(limits.max_connections));
      {
        std::lock_guard lock(registry_mutex);
        registry[connection.get()] = connection;
      }
      net::dispatch(connection->executor(), [connection] { connection->start(); });
    }
    accept();
  });
}

HttpTransport::HttpTransport(HttpLimits limits, HttpHandler handler,
                             std::vector<std::string> reserved_paths, HttpErrorBody error_body)
    : state_(std::make_shared<State>()) {
  state_->limits = limits;
  state_->handler = std::move(handler);
  state_->reserved_paths = std::move(reserved_paths);
  state_->error_body = std::move(error_body);
}

HttpTransport::~HttpTransport() {
  stop();
  std::vector<std::shared_ptr<HttpConnection>> connections;
  {
    std::lock_guard lock(state_->registry_mutex);
    for (auto& [raw, weak] : state_->registry) {
      if (auto c = weak.lock()) connections.push_back(std::move(c));
    }
    state_->registry.clear();
  }
  for (auto& c : connections) c->drop();
}

int HttpTransport::bind(const std::string& host, int port) {
  try {
    tcp::resolver resolver(state_->ioc);
    const auto results = resolver.resolve(host, std::to_string(port),
                                          tcp::resolver::passive | tcp::resolver::numeric_service);
    if (results.empty()) fail("cannot resolve '{}'", host);
    const tcp::endpoint endpoint = results.begin()->endpoint();
    tcp::acceptor& acceptor = state_->acceptor;
    acceptor.open(endpoint.protocol());
    acceptor.set_option(net::socket_base::reuse_address(true));
    acceptor.bind(endpoint);
    acceptor.listen(net::socket_base::max_listen_connections);
    const int bound = acceptor.local_endpoint().port();
    net::dispatch(state_->accept_strand, [s = state_.get()] { s->accept(); });
    return bound;
  } catch (const boost::system::system_error& e) {
    fail("cannot listen on {}:{}: {}", host, port, e.code().message());
  }
}

void HttpTransport::run(int threads) {
  std::vector<std::thread> extra;
  for (int i = 1; i < threads; ++i) extra.emplace_back([this] { state_->ioc.run(); });
  state_->ioc.run();
  for (auto& t : extra) t.join();
}

void HttpTransport::stop() {
  if (state_->stopped.exchange(true)) return;
  net::post(state_->accept_strand, [s = state_.get()] {
    beast::error_code ignored;
    s->acceptor.close(ignored);
    s->accept_retry.cancel();
  });
  // Let responses already queued (e.g. the last chunks of streams that just finished) leave.
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  while (state_->writing.load() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  state_->ioc.stop();
}

HttpTransportStats HttpTransport::stats() const {
  return {.open_connections = state_->open.load(),
          .refused_connections = state_->refused.load(),
          .limited_connections = state_->limited.load(),
          .timed_out_requests = state_->timed_out.load(),
          .malformed_requests = state_->malformed.load(),
          .aborted_responses = state_->aborted.load()};
}

const HttpLimits& HttpTransport::limits() const { return state_->limits; }

uint64_t raise_open_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return static_cast<uint64_t>(limit.rlim_cur);
}

}  // namespace sieve::server
