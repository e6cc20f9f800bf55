#pragma once
// A blocking HTTP/1.1 client over one POSIX socket, for clients that misbehave on purpose (the
// soak's disconnects, slow readers, slow-loris and malformed requests): the caller decides every
// byte sent, when to read, how much, and when to close. Every wait has a deadline; failures are
// values (a status and a reason), never exceptions.
//
//   RawConnection::open ─► send(bytes) ─► read_head() ─► read_body(max) ... ─► destructor closes
//   body framing: Transfer-Encoding: chunked, Content-Length, or until the server closes.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "loadgen/client.h"

namespace sieve::loadgen {

// Transfer-Encoding: chunked, decoded as bytes arrive in arbitrary pieces. Trailers are skipped.
class ChunkedDecoder {
 public:
  // Appends raw bytes; returns the body bytes they complete. Sets error() on a malformed chunk
  // header (and returns nothing more from then on).
  std::string feed(std::string_view bytes);
  bool done() const { return state_ == State::kDone; }
  const std::string& error() const { return error_; }

 private:
  enum class State { kSize, kData, kDataEnd, kTrailer, kDone, kError };
  State state_ = State::kSize;
  std::string line_;        // the header or trailer line being read
  uint64_t data_left_ = 0;  // bytes of the current chunk still to come
  std::string error_;
};

struct ResponseHead {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  bool chunked = false;
  std::optional<uint64_t> content_length;
};

struct BodyRead {
  enum class Status {
    kData,     // `bytes` holds body bytes (at least one)
    kEnd,      // the body ended as framed (or the server closed an unframed body)
    kTimeout,  // nothing arrived before the deadline
    kClosed,   // the server closed (or reset) the connection inside a framed body
    kError,    // malformed framing
  };
  Status status = Status::kEnd;
  std::string bytes;
  std::string error;  // what went wrong, for kClosed and kError
};

class RawConnection {
 public:
  // Connects to url within the deadline. receive_buffer_bytes > 0 shrinks the socket's receive
  // buffer (SO_RCVBUF, set before connecting) so a slow reader pushes back on the server early.
  // Returns the reason on failure.
  static std::variant<std::unique_ptr<RawConnection>, std::string> open(
      const ServerUrl& url, Clock::time_point deadline, int receive_buffer_bytes = 0);
  ~RawConnection();
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  // Sends every byte before the deadline; the reason when the connection failed or timed out.
  std::optional<std::string> send(std::string_view bytes, Clock::time_point deadline);
  // Half-closes: the server reads end-of-stream after what was sent.
  void shutdown_write();
  // Reads the status line and headers. The reason when they did not arrive (timeout, close,
  // not HTTP).
  std::variant<ResponseHead, std::string> read_head(Clock::time_point deadline);
  // Reads at most max_raw_bytes from the socket (fewer body bytes once framing is removed) and
  // returns the body bytes, waiting until some arrive, the body ends or the deadline passes.
  BodyRead read_body(size_t max_raw_bytes, Clock::time_point deadline);
  // True when the server has closed the connection or has data for us (e.g. an early response),
  // checked without blocking.
  bool readable_or_closed();

 private:
  explicit RawConnection(int fd) : fd_(fd) {}
  enum class Received { kData, kTimeout, kClosed, kError };
  Received receive(size_t max_bytes, Clock::time_point deadline, std::string& out);

  int fd_ = -1;
  std::string pending_;  // bytes read past the head, not yet handed out as body
  ResponseHead head_;
  ChunkedDecoder chunked_;
  uint64_t body_read_ = 0;  // body bytes handed out (Content-Length framing)
};

// "METHOD PATH HTTP/1.1" with Host, Connection: close, the given extra header lines ("Name: v")
// and a Content-Length of the body's size unless content_length says otherwise.
std::string http_request(std::string_view method, std::string_view path, const ServerUrl& url,
                         std::string_view body, const std::vector<std::string>& headers = {},
                         std::optional<uint64_t> content_length = std::nullopt);

}  // namespace sieve::loadgen
