#pragma once
// Incremental parser of a text/event-stream body: bytes arrive in arbitrary pieces, complete
// events come out. Only the data field matters to OpenAI-style streams; several data lines of
// one event are joined with '\n', comments (":...") and other fields are ignored.
#include <string>
#include <string_view>
#include <vector>

namespace sieve::loadgen {

class SseParser {
 public:
  // Appends bytes and returns the data of every event they completed, in order.
  std::vector<std::string> feed(std::string_view bytes);
  // The data of an event the stream ended inside (no blank line after it), if any.
  std::vector<std::string> finish();

 private:
  void take_line(std::string_view line, std::vector<std::string>& events);

  std::string pending_;  // bytes after the last complete line
  std::string data_;     // data lines of the event being read
  bool has_data_ = false;
};

}  // namespace sieve::loadgen
