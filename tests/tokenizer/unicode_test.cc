#include "tokenizer/unicode.h"

#include <gtest/gtest.h>

namespace sieve::tok::unicode {
namespace {

uint32_t decode_at(std::string_view text, size_t& offset) { return decode_lenient(text, offset); }

TEST(Unicode, Gpt2ByteMap) {
  EXPECT_EQ(byte_to_unicode('A'), "A");
  EXPECT_EQ(byte_to_unicode('!'), "!");
  EXPECT_EQ(byte_to_unicode(' '), "\u0120");   // "Ġ"
  EXPECT_EQ(byte_to_unicode('\n'), "\u010A");  // "Ċ"
  EXPECT_EQ(byte_to_unicode(0x00), "\u0100");
  EXPECT_EQ(byte_to_unicode(0xAD), "\u0143");  // the last of the 68 remapped bytes
  EXPECT_EQ(byte_to_unicode(0xFF), "\u00FF");
  for (int byte = 0; byte < 256; ++byte) {
    const std::string_view mapped = byte_to_unicode(static_cast<uint8_t>(byte));
    size_t offset = 0;
    const uint32_t cpt = decode_at(mapped, offset);
    EXPECT_EQ(offset, mapped.size());
    EXPECT_EQ(unicode_to_byte(cpt), byte);
  }
  EXPECT_FALSE(unicode_to_byte(' '));  // space is remapped, so U+0020 is no byte's image
  EXPECT_FALSE(unicode_to_byte(0x2581));
}

TEST(Unicode, LenientDecoding) {
  size_t offset = 0;
  EXPECT_EQ(decode_at("\xE2\x96\x81", offset), 0x2581u);
  EXPECT_EQ(offset, 3u);
  offset = 0;
  EXPECT_EQ(decode_at("\xF0\x9F\x98\x81", offset), 0x1F601u);
  EXPECT_EQ(offset, 4u);
  // Truncated, stray continuation, invalid lead, above U+10FFFF: one U+FFFD per byte.
  for (std::string_view bad : {"\xC3", "\x80", "\xFF", "\xF7\xBF\xBF\xBF", "\xE2\x28\xA1"}) {
    offset = 0;
    EXPECT_EQ(decode_at(bad, offset), kReplacementChar);
    EXPECT_EQ(offset, 1u);
  }
  offset = 0;  // overlong forms decode to what they spell, as in llama.cpp
  EXPECT_EQ(decode_at("\xC0\x80", offset), 0u);
}

TEST(Unicode, NfcComposesWellFormedStretchesAndKeepsMalformedBytes) {
  EXPECT_EQ(to_nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(to_nfc("Cafe\u0301 e\u0301\u0323"), "Caf\u00E9 \u1EB9\u0301");  // reordered marks
  EXPECT_EQ(to_nfc("\u037E \u2001 \u095D"), "; \u2003 \u0922\u093C");       // singletons, exclusion
  EXPECT_EQ(to_nfc("\u00E9\u65E5\U0001F44B"), "\u00E9\u65E5\U0001F44B");    // NFC already
  // A stray byte, an overlong '/' and an encoded surrogate stay; the text around them composes.
  EXPECT_EQ(to_nfc("e\u0301\xFF"
                   "e\u0301\xC0\xAF\xED\xA0\x80"
                   "a\u0308"),
            "\u00E9\xFF\u00E9\xC0\xAF\xED\xA0\x80\u00E4");
}

TEST(Unicode, Validity) {
  EXPECT_TRUE(is_valid_utf8(""));
  EXPECT_TRUE(is_valid_utf8("héllo \xF0\x9F\x98\x81 \uFFFD"));
  EXPECT_FALSE(is_valid_utf8("\xC3"));
  EXPECT_FALSE(is_valid_utf8("\xC0\x80"));          // overlong
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
}

TEST(Unicode, Utf8Encoding) {
  for (uint32_t cpt : {0x24u, 0xA2u, 0x939u, 0x20ACu, 0xD55Cu, 0x10348u, 0x10FFFFu}) {
    std::string text;
    append_utf8(text, cpt);
    size_t offset = 0;
    EXPECT_EQ(decode_at(text, offset), cpt);
    EXPECT_EQ(offset, text.size());
  }
}

TEST(Unicode, SpmSpaces) {
  EXPECT_EQ(escape_spm_spaces(" a  b "), "\u2581a\u2581\u2581b\u2581");
  EXPECT_EQ(unescape_spm_spaces("\u2581a\u2581\u2581b"), " a  b");
  EXPECT_EQ(sequence_length(0xE2), 3u);
  EXPECT_EQ(sequence_length(0x80), 1u);
}

}  // namespace
}  // namespace sieve::tok::unicode
