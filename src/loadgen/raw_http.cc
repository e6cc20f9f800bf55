#include "loadgen/raw_http.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace sieve::loadgen {

namespace {

// Milliseconds to the deadline for poll(), at least 0.
int poll_timeout_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 60'000));
}

// Waits until fd is ready for `events`; false at the deadline.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int ready = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return true;  // let the read or write report the error
    if (ready == 0 && Clock::now() >= deadline) return false;
  }
}

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r'))
    text.remove_suffix(1);
  return text;
}

}  // namespace

std::string ChunkedDecoder::feed(std::string_view bytes) {
  std::string out;
  while (!bytes.empty() && state_ != State::kDone && state_ != State::kError) {
    if (state_ == State::kData) {
      const size_t take = static_cast<size_t>(std::min<uint64_t>(data_left_, bytes.size()));
      out.append(bytes.substr(0, take));
      bytes.remove_prefix(take);
      data_left_ -= take;
      if (data_left_ == 0) state_ = State::kDataEnd;
      continue;
    }
    // The other states read a line.
    const size_t newline = bytes.find('\n');
    line_.append(bytes.substr(0, newline));
    if (newline == std::string_view::npos) {
      if (line_.size() > 4096) {
        state_ = State::kError;
        error_ = "chunk header line longer than 4096 bytes";
      }
      return out;
    }
    bytes.remove_prefix(newline + 1);
    const std::string_view line = trim(line_);
    if (state_ == State::kDataEnd) {
      if (!line.empty()) {
        state_ = State::kError;
        error_ = "chunk data not followed by CRLF";
      } else {
        state_ = State::kSize;
      }
    } else if (state_ == State::kTrailer) {
      if (line.empty()) state_ = State::kDone;
    } else {  // kSize: hex size, optional ";extensions"
      const std::string_view size_text = trim(line.substr(0, line.find(';')));
      uint64_t size = 0;
      bool valid = !size_text.empty() && size_text.size() <= 15;
      for (const char c : size_text) {
        const int digit = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                          : (c >= 'a' && c <= 'f')                    ? c - 'a' + 10
                          : (c >= 'A' && c <= 'F')                    ? c - 'A' + 10
                                                                      : -1;
        if (digit < 0) valid = false;
        size = size * 16 + static_cast<uint64_t>(std::max(digit, 0));
      }
      if (!valid) {
        state_ = State::kError;
        error_ = fmt::format("bad chunk size line '{}'", line.substr(0, 64));
      } else if (size == 0) {
        state_ = State::kTrailer;
      } else {
        data_left_ = size;
        state_ = State::kData;
      }
    }
    line_.clear();
  }
  return out;
}

std::variant<std::unique_ptr<RawConnection>, std::string> RawConnection::open(
    const ServerUrl& url, Clock::time_point deadline, int receive_buffer_bytes) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(url.port);
  if (const int rc = ::getaddrinfo(url.host.c_str(), port.c_str(), &hints, &found); rc != 0)
    return fmt::format("cannot resolve {}: {}", url.host, gai_strerror(rc));
  std::string reason = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      reason = fmt::format("socket: {}", std::strerror(errno));
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (receive_buffer_bytes > 0) {
      ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer_bytes, sizeof(receive_buffer_bytes));
    }
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      ::freeaddrinfo(found);
      return std::unique_ptr<RawConnection>(new RawConnection(fd));
    }
    if (errno == EINPROGRESS && wait_for(fd, POLLOUT, deadline)) {
      int error = 0;
      socklen_t length = sizeof(error);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      if (error == 0) {
        ::freeaddrinfo(found);
        return std::unique_ptr<RawConnection>(new RawConnection(fd));
      }
      reason = fmt::format("connect: {}", std::strerror(error));
    } else {
      reason = errno == EINPROGRESS ? std::string("connect: timed out")
                                    : fmt::format("connect: {}", std::strerror(errno));
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return reason;
}

RawConnection::~RawConnection() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<std::string> RawConnection::send(std::string_view bytes, Clock::time_point deadline) {
  while (!bytes.empty()) {
    const ssize_t sent = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (sent > 0) {
      bytes.remove_prefix(static_cast<size_t>(sent));
      continue;
    }
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!wait_for(fd_, POLLOUT, deadline)) return std::string("send timed out");
      continue;
    }
    return fmt::format("send: {}", std::strerror(errno));
  }
  return std::nullopt;
}

void RawConnection::shutdown_write() { ::shutdown(fd_, SHUT_WR); }

bool RawConnection::readable_or_closed() {
  pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
  return ::poll(&p, 1, 0) > 0;
}

RawConnection::Received RawConnection::receive(size_t max_bytes, Clock::time_point deadline,
                                               std::string& out) {
  char buffer[16384];
  max_bytes = std::min(max_bytes, sizeof(buffer));
  for (;;) {
    const ssize_t got = ::recv(fd_, buffer, max_bytes, 0);
    if (got > 0) {
      out.append(buffer, static_cast<size_t>(got));
      return Received::kData;
    }
    if (got == 0) return Received::kClosed;
    if (errno == ECONNRESET || errno == EPIPE) return Received::kClosed;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return Received::kError;
    if (!wait_for(fd_, POLLIN, deadline)) return Received::kTimeout;
  }
}

std::variant<ResponseHead, std::string> RawConnection::read_head(Clock::time_point deadline) {
  constexpr size_t kMaxHead = 64 * 1024;
  size_t end = std::string::npos;
  while ((end = pending_.find("\r\n\r\n")) == std::string::npos) {
    if (pending_.size() > kMaxHead) return std::string("response head over 64 KiB");
    switch (receive(16384, deadline, pending_)) {
      case Received::kData:
        continue;
      case Received::kTimeout:
        return std::string("timed out waiting for the response");
      case Received::kClosed:
        return std::string(pending_.empty() ? "closed without a response"
                                            : "closed inside the response head");
      case Received::kError:
        return fmt::format("recv: {}", std::strerror(errno));
    }
  }
  const std::string head_text = pending_.substr(0, end);
  pending_.erase(0, end + 4);
  ResponseHead head;
  size_t line_end = head_text.find("\r\n");
  const std::string status_line = head_text.substr(0, line_end);
  if (!status_line.starts_with("HTTP/1.") || status_line.size() < 12)
    return fmt::format("not an HTTP response: '{}'", status_line.substr(0, 64));
  head.status = std::atoi(status_line.c_str() + 9);
  while (line_end != std::string::npos) {
    const size_t start = line_end + 2;
    line_end = head_text.find("\r\n", start);
    const std::string_view line = std::string_view(head_text).substr(
        start, line_end == std::string::npos ? std::string::npos : line_end - start);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    head.headers[lower(trim(line.substr(0, colon)))] = std::string(trim(line.substr(colon + 1)));
  }
  if (const auto te = head.headers.find("transfer-encoding"); te != head.headers.end())
    head.chunked = lower(te->second).find("chunked") != std::string::npos;
  if (const auto cl = head.headers.find("content-length");
      cl != head.headers.end() && !head.chunked)
    head.content_length = std::strtoull(cl->second.c_str(), nullptr, 10);
  head_ = head;
  return head;
}

BodyRead RawConnection::read_body(size_t max_raw_bytes, Clock::time_point deadline) {
  using Status = BodyRead::Status;
  const auto framed_end = [&] {
    return head_.chunked ? chunked_.done()
                         : head_.content_length && body_read_ >= *head_.content_length;
  };
  for (;;) {
    if (!chunked_.error().empty()) return {.status = Status::kError, .error = chunked_.error()};
    if (!pending_.empty()) {
      std::string raw = pending_.substr(0, max_raw_bytes);
      pending_.erase(0, raw.size());
      std::string body;
      if (head_.chunked) {
        body = chunked_.feed(raw);
      } else if (head_.content_length) {
        body = raw.substr(0, static_cast<size_t>(*head_.content_length - body_read_));
        body_read_ += body.size();
      } else {
        body = std::move(raw);
      }
      if (!body.empty()) return {.status = Status::kData, .bytes = std::move(body)};
      continue;
    }
    if (framed_end()) return {.status = Status::kEnd};
    switch (receive(max_raw_bytes, deadline, pending_)) {
      case Received::kData:
        continue;
      case Received::kTimeout:
        return {.status = Status::kTimeout};
      case Received::kClosed:
        if (!head_.chunked && !head_.content_length) return {.status = Status::kEnd};
        return {.status = Status::kClosed, .error = "the server closed the connection mid-body"};
      case Received::kError:
        return {.status = Status::kClosed, .error = fmt::format("recv: {}", std::strerror(errno))};
    }
  }
}

std::string http_request(std::string_view method, std::string_view path, const ServerUrl& url,
                         std::string_view body, const std::vector<std::string>& headers,
                         std::optional<uint64_t> content_length) {
  std::string out = fmt::format("{} {} HTTP/1.1\r\nHost: {}:{}\r\nConnection: close\r\n", method,
                                path, url.host, url.port);
  for (const std::string& header : headers) out += header + "\r\n";
  if (!body.empty() || content_length) {
    out += fmt::format("Content-Length: {}\r\n", content_length.value_or(body.size()));
  }
  out += "\r\n";
  out.append(body);
  return out;
}

}  // namespace sieve::loadgen
