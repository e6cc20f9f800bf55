#include "tokenizer/unicode.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <array>

#include "util/error.h"

namespace sieve::tok::unicode {
namespace {

bool is_continuation(uint8_t byte) { return (byte & 0xC0) == 0x80; }

// The GPT-2 mapping, built once: forward as UTF-8 strings, backward as a dense table over
// U+0000..U+01FF (every mapped code point is below U+0144).
struct ByteMap {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 512> to_byte;  // -1 where no byte maps to the code point

  ByteMap() {
    to_byte.fill(-1);
    auto printable = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next_extra = 0;
    for (int b = 0; b < 256; ++b) {
      uint32_t cpt = printable(b) ? static_cast<uint32_t>(b) : 256u + next_extra++;
      append_utf8(to_unicode[b], cpt);
      to_byte[cpt] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (true) {
    size_t hit = text.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(text.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(text.substr(pos));
  return out;
}

}  // namespace

size_t sequence_length(uint8_t lead) {
  static constexpr uint8_t kLengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLengths[lead >> 4];
}

uint32_t decode_lenient(std::string_view text, size_t& offset) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[offset + i]); };
  const size_t left = text.size() - offset;
  const uint8_t lead = byte(0);
  if (lead < 0x80) {
    offset += 1;
    return lead;
  }
  size_t length = 0;
  uint32_t cpt = 0;
  if ((lead & 0xE0) == 0xC0) {
    length = 2;
    cpt = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    cpt = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    cpt = lead & 0x07;
  }
  bool ok = length != 0 && length <= left;
  for (size_t i = 1; ok && i < length; ++i) {
    ok = is_continuation(byte(i));
    cpt = (cpt << 6) | (byte(i) & 0x3F);
  }
  if (!ok || cpt > 0x10FFFF) {
    offset += 1;
    return kReplacementChar;
  }
  offset += length;
  return cpt;
}

bool is_valid_utf8(std::string_view text) {
  size_t offset = 0;
  while (offset < text.size()) {
    const size_t start = offset;
    const uint32_t cpt = decode_lenient(text, offset);
    const size_t length = offset - start;
    if (cpt == kReplacementChar && length == 1) return false;  // malformed byte
    const size_t shortest = cpt < 0x80 ? 1 : cpt < 0x800 ? 2 : cpt < 0x10000 ? 3 : 4;
    if (length != shortest) return false;              // overlong form
    if (cpt >= 0xD800 && cpt <= 0xDFFF) return false;  // surrogate
  }
  return true;
}

std::string_view byte_to_unicode(uint8_t byte) { return byte_map().to_unicode[byte]; }

std::optional<uint8_t> unicode_to_byte(uint32_t cpt) {
  if (cpt >= byte_map().to_byte.size() || byte_map().to_byte[cpt] < 0) return std::nullopt;
  return static_cast<uint8_t>(byte_map().to_byte[cpt]);
}

bool is_white_space(uint32_t cpt) {
  return u_hasBinaryProperty(static_cast<UChar32>(cpt), UCHAR_WHITE_SPACE) != 0;
}

bool is_alphanumeric(uint32_t cpt) {
  const auto c = static_cast<UChar32>(cpt);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC)) return true;
  const int8_t type = u_charType(c);
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

namespace {

// The offset where the code point ending at `offset` (> 0) starts: the lead byte up to three
// continuation bytes back when it decodes to exactly there, else the byte before (malformed).
size_t start_before(std::string_view text, size_t offset) {
  for (size_t back = 1; back <= 4 && back <= offset; ++back) {
    const auto byte = static_cast<uint8_t>(text[offset - back]);
    if ((byte & 0xC0) == 0x80) continue;  // a continuation byte
    size_t end = offset - back;
    decode_lenient(text, end);
    return end == offset ? offset - back : offset - 1;
  }
  return offset - 1;
}

}  // namespace

uint32_t code_point_before(std::string_view text, size_t offset) {
  size_t start = start_before(text, offset);
  const uint32_t cpt = decode_lenient(text, start);
  return start == offset ? cpt : kReplacementChar;
}

uint32_t code_point_at(std::string_view text, size_t offset) {
  return decode_lenient(text, offset);
}

size_t white_space_start_before(std::string_view text, size_t offset) {
  while (offset > 0) {
    const size_t start = start_before(text, offset);
    size_t end = start;
    const uint32_t cpt = decode_lenient(text, end);
    if (end != offset || !is_white_space(cpt)) break;
    offset = start;
  }
  return offset;
}

size_t white_space_end_after(std::string_view text, size_t offset) {
  while (offset < text.size()) {
    size_t next = offset;
    if (!is_white_space(decode_lenient(text, next))) break;
    offset = next;
  }
  return offset;
}

std::string escape_spm_spaces(std::string_view text) { return replace_all(text, " ", kSpmSpace); }

std::string unescape_spm_spaces(std::string_view text) { return replace_all(text, kSpmSpace, " "); }

std::string to_nfc(std::string_view text) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<uint8_t>(c) < 0x80; }))
    return std::string(text);  // ASCII is composed already
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) fail("ICU's NFC data is unavailable: {}", u_errorName(status));
  // A code point ICU reads as the lenient decoder does: well-formed, shortest form, no surrogate.
  auto well_formed = [](uint32_t cpt, size_t length) {
    const size_t shortest = cpt < 0x80 ? 1 : cpt < 0x800 ? 2 : cpt < 0x10000 ? 3 : 4;
    return length == shortest && !(cpt >= 0xD800 && cpt <= 0xDFFF) &&
           !(cpt == kReplacementChar && length == 1);
  };
  std::string out;
  out.reserve(text.size());
  size_t offset = 0;
  while (offset < text.size()) {
    size_t end = offset, next = offset;
    while (end < text.size()) {
      next = end;
      const uint32_t cpt = decode_lenient(text, next);
      if (!well_formed(cpt, next - end)) break;
      end = next;
    }
    if (end > offset) {
      const std::string_view run = text.substr(offset, end - offset);
      const icu::UnicodeString wide = icu::UnicodeString::fromUTF8(
          icu::StringPiece(run.data(), static_cast<int32_t>(run.size())));
      status = U_ZERO_ERROR;
      if (nfc->isNormalized(wide, status)) {
        out.append(run);
      } else {
        nfc->normalize(wide, status).toUTF8String(out);
      }
      if (U_FAILURE(status)) fail("NFC normalization failed: {}", u_errorName(status));
    }
    if (end < text.size()) {  // the malformed sequence, as it is
      next = end;
      decode_lenient(text, next);
      out.append(text.substr(end, next - end));
      end = next;
    }
    offset = end;
  }
  return out;
}

}  // namespace sieve::tok::unicode
