#pragma once
// The HTTP/1.1 layer under `sieve serve`: event-driven (Boost.Beast on Asio), so an open
// connection costs a socket and a few kilobytes, never a thread. A slow, idle or half-open
// client therefore cannot take capacity from anyone else; each one is bounded by deadlines:
//
//   whole request (head + body)  request_timeout from the first byte (from accept for a new
//                                connection): a client that trickles bytes is cut off when it
//                                expires, however often it sends (408, then close)
//   between keep-alive requests  keep_alive_timeout of silence, then close
//   each write                   write_timeout without progress, then close
//   a response stream            at most max_stream_buffer_bytes waiting to be sent: a client
//                                that stops reading is dropped and its request aborted
//
// Connections beyond max_connections are still accepted but only answer the reserved paths
// (/health, /metrics: a load balancer keeps hearing the truth); everything else gets a fast 503.
// Beyond max_connections + reserved_connections new sockets are closed at once.
//
// Handlers know nothing of sockets: each request comes with a Responder whose methods may be
// called from any thread; they are carried out in order on the connection's strand.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sieve::server {

struct HttpLimits {
  size_t max_connections = 4096;
  size_t reserved_connections = 64;
  std::chrono::milliseconds request_timeout{30000};
  std::chrono::milliseconds keep_alive_timeout{5000};
  std::chrono::milliseconds write_timeout{30000};
  size_t max_header_bytes = 16u << 10;  // request line + header lines
  size_t max_header_count = 100;
  size_t max_body_bytes = 8u << 20;
  size_t max_stream_buffer_bytes = 1u << 20;
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;
  std::string path;     // the target up to '?'
  std::string query;    // after '?', undecoded
  HttpHeaders headers;  // names lower-cased
  std::string body;
  int version = 11;  // 10 or 11
  // The value of the first header of that name (case-insensitive), or "".
  std::string header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  HttpHeaders headers;
};

class HttpConnection;

// One request's way back to its client. Every method is thread-safe and asynchronous; calls
// are carried out in order on the connection's strand, and are ignored once the response has
// ended or the client has gone.
class Responder {
 public:
  Responder(std::shared_ptr<HttpConnection> connection, uint64_t serial);

  // A whole response.
  void respond(HttpResponse response);
  // A streamed response (chunked under HTTP/1.1; until close under HTTP/1.0): head.body is
  // ignored; then any number of stream() calls and one end_stream().
  void start_stream(HttpResponse head);
  void stream(std::string data);
  void end_stream();
  // fn runs once, on the strand, if the response cannot be completed: the client closed its
  // connection, a write failed or timed out, or a stream fell max_stream_buffer_bytes behind.
  void on_abort(std::function<void()> fn);
  // Keeps `owner` alive until the response has ended or was aborted (the request's state,
  // which engine callbacks reach only through weak pointers).
  void hold(std::shared_ptr<void> owner);
  // Runs fn on the strand, in order with the calls above (e.g. an engine event).
  void post(std::function<void()> fn);

 private:
  std::shared_ptr<HttpConnection> connection_;
  uint64_t serial_;
};

using HttpHandler = std::function<void(HttpRequest, std::shared_ptr<Responder>)>;
// The JSON body of an error the transport answers itself (400, 413, 431, 500, 503).
using HttpErrorBody = std::function<std::string(int status, const std::string& message)>;

struct HttpTransportStats {
  int64_t open_connections = 0;
  int64_t refused_connections = 0;  // closed at accept: over max + reserved
  int64_t limited_connections = 0;  // over max: only the reserved paths were served
  int64_t timed_out_requests = 0;   // request_timeout or keep-alive expired mid-request
  int64_t malformed_requests = 0;   // 400 / 413 / 431
  int64_t aborted_responses = 0;    // client gone or too slow before the response ended
};

class HttpTransport {
 public:
  // reserved_paths are served even above max_connections.
  HttpTransport(HttpLimits limits, HttpHandler handler, std::vector<std::string> reserved_paths,
                HttpErrorBody error_body);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // Binds and listens (throws sieve::Error when it cannot). port 0 picks a free port; returns
  // the bound port.
  int bind(const std::string& host, int port);
  // Serves on the calling thread plus threads - 1 more until stop().
  void run(int threads);
  // Closes the listening socket, gives responses being written a moment to leave, and makes
  // run() return (connections close when the transport is destroyed). Safe before run().
  void stop();
  HttpTransportStats stats() const;
  const HttpLimits& limits() const;

 private:
  friend class HttpConnection;
  struct State;
  std::shared_ptr<State> state_;
};

// Raises this process's open-file limit to its hard maximum; returns the resulting soft limit.
uint64_t raise_open_file_limit();

}  // namespace sieve::server
