#pragma once
// Internal to src/tokenizer: UTF-8 helpers and the GPT-2 byte <-> unicode mapping.
//
// The decoder is deliberately lenient and mirrors llama.cpp's: a malformed sequence yields one
// U+FFFD per offending byte and decoding resumes at the next byte, so tokenization never fails
// on bad input. Overlong forms are accepted as the code point they spell; code points above
// U+10FFFF are treated as malformed.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "util/utf8.h"

namespace sieve::tok::unicode {

inline constexpr uint32_t kReplacementChar = 0xFFFD;
// U+2581 LOWER ONE EIGHTH BLOCK: how SentencePiece vocabularies spell a space.
inline constexpr std::string_view kSpmSpace = "\xE2\x96\x81";

// Byte length of the sequence a lead byte announces (1 for ASCII and stray continuation
// bytes, 2..4 otherwise). Does not validate the sequence.
size_t sequence_length(uint8_t lead);

// Decodes the code point at text[offset] and advances offset past it. Never fails: a malformed
// sequence gives kReplacementChar and advances by exactly one byte. Requires offset < size.
uint32_t decode_lenient(std::string_view text, size_t& offset);

// Appends the UTF-8 encoding of a code point (<= 0x10FFFF; surrogates are encoded as is).
using sieve::append_utf8;

// Whether text is well-formed UTF-8 (no surrogates, no overlong forms, <= U+10FFFF).
bool is_valid_utf8(std::string_view text);

// GPT-2's bytes_to_unicode(): every byte maps to a printable code point (the printable Latin-1
// bytes to themselves, the other 68 bytes to U+0100.. in byte order). Byte-level BPE vocabularies
// store token text in this alphabet.
std::string_view byte_to_unicode(uint8_t byte);  // the UTF-8 of the mapped code point
std::optional<uint8_t> unicode_to_byte(uint32_t cpt);

// The text in Unicode Normalization Form C (ICU's, Unicode 15 in Debian 12's ICU 72). Only
// well-formed stretches are composed; malformed bytes, overlong forms and surrogates are kept
// as they are, for the tokenizer to treat as it does without normalization.
std::string to_nfc(std::string_view text);

// Unicode properties from ICU, as Rust's char::is_whitespace / is_alphanumeric (which Hugging
// Face's added tokens use) define them: White_Space; Alphabetic or a number (Nd, Nl, No).
bool is_white_space(uint32_t cpt);
bool is_alphanumeric(uint32_t cpt);
// The code point that ends at text[offset] (offset > 0), or the one that starts there (offset
// < size), decoded leniently (a malformed byte reads as kReplacementChar).
uint32_t code_point_before(std::string_view text, size_t offset);
uint32_t code_point_at(std::string_view text, size_t offset);
// The start of the run of white space that ends at offset / the end of the one that starts
// there (offset itself when there is none).
size_t white_space_start_before(std::string_view text, size_t offset);
size_t white_space_end_after(std::string_view text, size_t offset);

// Replaces every space by U+2581.
std::string escape_spm_spaces(std::string_view text);
// Replaces every U+2581 by a space.
std::string unescape_spm_spaces(std::string_view text);

}  // namespace sieve::tok::unicode
