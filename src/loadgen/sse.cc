#include "loadgen/sse.h"

namespace sieve::loadgen {

std::vector<std::string> SseParser::feed(std::string_view bytes) {
  std::vector<std::string> events;
  pending_.append(bytes);
  size_t start = 0;
  for (size_t newline; (newline = pending_.find('\n', start)) != std::string::npos;
       start = newline + 1) {
    std::string_view line(pending_.data() + start, newline - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    take_line(line, events);
  }
  pending_.erase(0, start);
  return events;
}

std::vector<std::string> SseParser::finish() {
  std::vector<std::string> events;
  if (!pending_.empty()) take_line(pending_, events);
  pending_.clear();
  take_line("", events);
  return events;
}

void SseParser::take_line(std::string_view line, std::vector<std::string>& events) {
  if (line.empty()) {
    if (has_data_) events.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (!line.starts_with("data:")) return;
  line.remove_prefix(5);
  if (line.starts_with(' ')) line.remove_prefix(1);
  if (has_data_) data_ += '\n';
  data_.append(line);
  has_data_ = true;
}

}  // namespace sieve::loadgen
