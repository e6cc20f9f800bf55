#include "engine/text_stream.h"

#include <utility>

namespace sieve::engine {

namespace {
// Length of the UTF-8 sequence a lead byte announces (1 for ASCII and stray bytes).
size_t sequence_length(unsigned char lead) {
  if (lead >= 0xF0 && lead <= 0xF7) return 4;
  if (lead >= 0xE0) return lead <= 0xEF ? 3 : 1;
  if (lead >= 0xC0) return 2;
  return 1;
}
}  // namespace

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  // Find the start of the last (possibly incomplete) character within the last 3 bytes.
  size_t cut = pending_.size();
  for (size_t back = 1; back <= 3 && back <= pending_.size(); ++back) {
    const auto byte = static_cast<unsigned char>(pending_[pending_.size() - back]);
    if ((byte & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    if (sequence_length(byte) > back) cut = pending_.size() - back;
    break;
  }
  std::string ready = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return ready;
}

std::string Utf8Stream::flush() { return std::exchange(pending_, {}); }

}  // namespace sieve::engine
