#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <span>
#include <utility>

#include "tokenizer/unicode.h"
#include "util/error.h"

namespace sieve::tok {
namespace {

// ---------------------------------------------------------------------------------------------
// The regex lists, per family (as llama.cpp's llm_tokenizer_bpe has them). Written with \s/\S,
// which expand_whitespace() rewrites to kWhitespace; every non-ASCII character is a \x{...}
// escape so that no editor or tool can silently normalize it (NFC would turn U+212A KELVIN
// SIGN into 'K' and break DeepSeek's letter ranges).

// Unicode White_Space (llama.cpp's unicode_set_whitespace), as the body of a character class.
constexpr std::string_view kWhitespace =
    R"(\t-\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// llama.cpp matches this one (and kLlama3) with hand-written code that also takes a whitespace
// run the other alternatives leave, hence the final `|\s+`.
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

#define SIEVE_CONTRACTIONS R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]))"
constexpr std::string_view kLlama3 = SIEVE_CONTRACTIONS
    R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2 = SIEVE_CONTRACTIONS
    R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen35 = SIEVE_CONTRACTIONS
    R"(|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+)"
    R"(|\s+(?!\S)|\s+)";
constexpr std::string_view kSeedCoder = SIEVE_CONTRACTIONS
    R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kBailingMoe =
    R"('(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
// llama.cpp's approximation of \p{Lu}/\p{Ll}: "a letter that is not a-z" / "not A-Z".
constexpr std::string_view kGpt4o =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+)" SIEVE_CONTRACTIONS
    R"(?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*)" SIEVE_CONTRACTIONS
    R"(?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kTekken =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+)"
    R"(|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*)"
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
#undef SIEVE_CONTRACTIONS

// DeepSeek's "cased letter" class (Lu/Ll/Lt as of the Unicode version its tokenizer used).
constexpr std::string_view kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})"
    R"(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A})"
    R"(\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556})"
    R"(\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF})"
    R"(\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D})"
    R"(\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D})"
    R"(\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4})"
    R"(\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4})"
    R"(\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124})"
    R"(\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F})"
    R"(\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})"
    R"(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17})"
    R"(\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3})"
    R"(\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF})"
    R"(\x{1E900}-\x{1E943}]+)";
// ASCII and full-width punctuation, curly quotes, ideographic space/comma/full stop.
constexpr std::string_view kDeepseekPunct =
    R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)";
// CJK ideographs, U+0800..U+4E00 and Hangul syllables.
constexpr std::string_view kDeepseekCjk =
    R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
// llama.cpp writes this `\s+$`; the lookbehind and possessive repeat make the leftmost match
// the same but keep a long whitespace run linear instead of quadratic.
constexpr std::string_view kTrailingSpace = R"((?<!\s)\s++$)";

constexpr std::string_view kDeepseek3Main =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+)"
    R"(| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Anything but whitespace and a few (Latin, CJK, Devanagari, Arabic) sentence marks.
constexpr std::string_view kPoro =
    R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{0964}\x{06D4}\x{060C})]+)";

enum class Family {
  kDefault,
  kGpt2,
  kLlama3,
  kDeepseekLlm,
  kDeepseekCoder,
  kDeepseek3,
  kFalcon,
  kStarcoder,
  kQwen2,
  kQwen35,
  kPoro,
  kViking,
  kGpt4o,
  kTekken,
  kSeedCoder,
  kBailingMoe,
};

std::vector<std::string_view> family_regexes(Family family) {
  switch (family) {
    case Family::kDefault:
      return {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"};
    case Family::kGpt2:
      return {kGpt2};
    case Family::kLlama3:
      return {kLlama3};
    case Family::kDeepseekLlm:
      return {R"([\r\n])",    kDeepseekLetters, kDeepseekPunct,
              kTrailingSpace, kDeepseekCjk,     R"(\p{N}+)"};
    case Family::kDeepseekCoder:
      return {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"};
    case Family::kDeepseek3:
      return {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
              kDeepseek3Main};
    case Family::kFalcon:
      return {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"};
    case Family::kStarcoder:
      return {R"(\p{N})", kGpt2};
    case Family::kQwen2:
      return {kQwen2};
    case Family::kQwen35:
      return {kQwen35};
    case Family::kPoro:
      return {kPoro};
    case Family::kViking:
      return {kPoro, R"(\p{N})"};
    case Family::kGpt4o:
      return {kGpt4o};
    case Family::kTekken:
      return {kTekken};
    case Family::kSeedCoder:
      return {kSeedCoder};
    case Family::kBailingMoe:
      return {kBailingMoe};
  }
  return {};
}

struct FamilyEntry {
  std::string_view name;
  Family family;
  PreTokenizerTraits traits;
};

// tokenizer.ggml.pre values and what they select (llama.cpp's llama_vocab::load).
constexpr PreTokenizerTraits kPlain{};
constexpr PreTokenizerTraits kLlama3Traits{.ignore_merges = true, .add_bos = true};
constexpr FamilyEntry kFamilies[] = {
    {"default", Family::kDefault, kPlain},
    {"llama3", Family::kLlama3, kLlama3Traits},
    {"llama-v3", Family::kLlama3, kLlama3Traits},
    {"llama-bpe", Family::kLlama3, kLlama3Traits},
    {"falcon3", Family::kLlama3, kLlama3Traits},
    {"falcon-h1", Family::kLlama3, kLlama3Traits},
    {"pixtral", Family::kLlama3, kLlama3Traits},
    {"midm-2.0", Family::kLlama3, kLlama3Traits},
    {"lfm2", Family::kLlama3, kLlama3Traits},
    {"dbrx", Family::kLlama3, kPlain},
    {"smaug-bpe", Family::kLlama3, kPlain},
    {"glm4", Family::kLlama3, kPlain},
    {"chatglm-bpe", Family::kLlama3, kPlain},
    {"deepseek-llm", Family::kDeepseekLlm, kPlain},
    {"deepseek-coder", Family::kDeepseekCoder, kPlain},
    {"deepseek-v3", Family::kDeepseek3, kPlain},
    {"hunyuan-dense", Family::kDeepseek3, kPlain},
    {"falcon", Family::kFalcon, kPlain},
    {"gpt-2", Family::kGpt2, kPlain},
    {"mpt", Family::kGpt2, kPlain},
    {"olmo", Family::kGpt2, kPlain},
    {"jais", Family::kGpt2, kPlain},
    {"phi-2", Family::kGpt2, kPlain},
    {"jina-es", Family::kGpt2, kPlain},
    {"jina-de", Family::kGpt2, kPlain},
    {"jina-v1-en", Family::kGpt2, kPlain},
    {"jina-v2-es", Family::kGpt2, kPlain},
    {"jina-v2-de", Family::kGpt2, kPlain},
    {"jina-v2-code", Family::kGpt2, kPlain},
    {"roberta-bpe", Family::kGpt2, kPlain},
    {"gigachat", Family::kGpt2, kPlain},
    {"a.x-4.0", Family::kGpt2, kPlain},
    {"mellum", Family::kGpt2, kPlain},
    {"modern-bert", Family::kGpt2, kPlain},
    {"trillion", Family::kGpt2, kPlain},
    {"granite-docling", Family::kGpt2, kPlain},
    {"exaone4", Family::kGpt2, kPlain},
    {"starcoder", Family::kStarcoder, kPlain},
    {"refact", Family::kStarcoder, kPlain},
    {"command-r", Family::kStarcoder, kPlain},
    {"smollm", Family::kStarcoder, kPlain},
    {"codeshell", Family::kStarcoder, kPlain},
    {"exaone", Family::kStarcoder, kPlain},
    {"minerva-7b", Family::kStarcoder, kPlain},
    {"qwen2", Family::kQwen2, kPlain},
    {"deepseek-r1-qwen", Family::kQwen2, kPlain},
    {"stablelm2", Family::kQwen2, kPlain},
    {"hunyuan", Family::kQwen2, kPlain},
    {"megrez", Family::kQwen2, kPlain},
    {"solar-open", Family::kQwen2, kPlain},
    {"grok-2", Family::kQwen2, kPlain},
    {"qwen35", Family::kQwen35, kPlain},
    {"poro-chat", Family::kPoro, kPlain},
    {"bloom", Family::kPoro, kPlain},
    {"gpt3-finnish", Family::kPoro, kPlain},
    {"viking", Family::kViking, kPlain},
    {"gpt-4o", Family::kGpt4o, kPlain},
    {"llama4", Family::kGpt4o, kPlain},
    {"minimax-m2", Family::kGpt4o, kPlain},
    {"tekken", Family::kTekken, kLlama3Traits},
    {"seed-coder", Family::kSeedCoder, kPlain},
    {"bailingmoe", Family::kBailingMoe, kPlain},
    {"bailingmoe2", Family::kBailingMoe, kPlain},
    {"llada-moe", Family::kBailingMoe, kPlain},
};

const FamilyEntry* find_family(std::string_view name) {
  for (const FamilyEntry& entry : kFamilies) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

// Rewrites \s and \S to the explicit White_Space class (inside a class: its body).
std::string expand_whitespace(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        out += in_class ? std::string(kWhitespace) : "[" + std::string(kWhitespace) + "]";
      } else if (next == 'S' && !in_class) {
        out += "[^" + std::string(kWhitespace) + "]";
      } else {
        out += c;
        out += next;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

// Valid UTF-8 for PCRE2, and llama.cpp's view of the text: malformed bytes become U+FFFD.
// Surrogate code points (which the lenient decoder lets through, as llama.cpp's does) are kept
// in `text` but shown to the matcher as U+E000, a private-use character of the same UTF-8
// length and the same class in every pattern here (\p{C}: not a letter, digit or space).
struct NormalizedText {
  std::string text;   // what the words are cut from
  std::string match;  // same length, always valid UTF-8
};

NormalizedText normalize(std::string_view input) {
  NormalizedText out;
  out.text.reserve(input.size());
  size_t offset = 0;
  bool has_surrogates = false;
  while (offset < input.size()) {
    const uint32_t cpt = unicode::decode_lenient(input, offset);
    unicode::append_utf8(out.text, cpt);
    has_surrogates |= cpt >= 0xD800 && cpt <= 0xDFFF;
  }
  if (!has_surrogates) {
    out.match = out.text;
    return out;
  }
  offset = 0;
  while (offset < out.text.size()) {
    const uint32_t cpt = unicode::decode_lenient(out.text, offset);
    unicode::append_utf8(out.match, cpt >= 0xD800 && cpt <= 0xDFFF ? 0xE000 : cpt);
  }
  return out;
}

constexpr size_t kJitStackMin = 32 * 1024;
constexpr size_t kJitStackMax = 16 * 1024 * 1024;
constexpr uint32_t kHeapLimitKiB = 1024 * 1024;  // 1 GiB

struct Span {
  size_t begin = 0;
  size_t end = 0;
};

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Regex() { pcre2_code_free(code); }
};

std::optional<PreTokenizerTraits> find_pre_tokenizer(std::string_view name) {
  const FamilyEntry* entry = find_family(name);
  if (entry == nullptr) return std::nullopt;
  return entry->traits;
}

PreTokenizer::PreTokenizer(std::string_view name) {
  const FamilyEntry* entry = find_family(name);
  if (entry == nullptr) {
    fail(
        "unknown pre-tokenizer type '{}' (tokenizer.ggml.pre); sieve supports the llama.cpp "
        "families default, gpt-2, llama3, qwen2, deepseek-llm, deepseek-coder, falcon, "
        "starcoder and others, see src/tokenizer/pretokenizer.cc",
        name);
  }
  traits_ = entry->traits;
  for (std::string_view source : family_regexes(entry->family)) {
    const std::string pattern = expand_whitespace(source);
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    auto regex = std::make_unique<Regex>();
    // NO_AUTO_CAPTURE: groups only structure the pattern; nothing is captured, which also keeps
    // repeated groups cheap on long words.
    regex->code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY | PCRE2_NO_AUTO_CAPTURE,
                      &error_code, &error_offset, nullptr);
    if (regex->code == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error_code, message.data(), message.size());
      fail("pre-tokenizer '{}': regex does not compile at offset {}: {}", name, error_offset,
           reinterpret_cast<const char*>(message.data()));
    }
    regex->jit = pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE) == 0;
    regexes_.push_back(std::move(regex));
  }
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

std::vector<std::string> PreTokenizer::split(std::string_view input) const {
  const NormalizedText normalized = normalize(input);
  const std::string& subject_text = normalized.match;
  std::vector<Span> pieces;
  if (!subject_text.empty()) pieces.push_back({0, subject_text.size()});

  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match_data(
      pcre2_match_data_create(1, nullptr), &pcre2_match_data_free);
  // Patterns with repeated groups (gpt-4o, tekken) backtrack through one frame per letter: give
  // the JIT a stack that grows to kJitStackMax (reserved lazily) and the interpreter, the
  // fallback, room for words far longer than any real text has.
  std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)> context(
      pcre2_match_context_create(nullptr), &pcre2_match_context_free);
  std::unique_ptr<pcre2_jit_stack, decltype(&pcre2_jit_stack_free)> jit_stack(
      pcre2_jit_stack_create(kJitStackMin, kJitStackMax, nullptr), &pcre2_jit_stack_free);
  if (!match_data || !context || !jit_stack) throw std::bad_alloc();
  pcre2_jit_stack_assign(context.get(), nullptr, jit_stack.get());
  pcre2_set_heap_limit(context.get(), kHeapLimitKiB);

  std::vector<Span> next;
  for (const auto& regex : regexes_) {
    next.clear();
    next.reserve(pieces.size() * 2);
    for (const Span& piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(subject_text.data() + piece.begin);
      const size_t length = piece.end - piece.begin;
      size_t unmatched_from = 0;  // start of the stretch not yet emitted
      size_t search_from = 0;
      while (search_from < length) {
        // The subject is the piece alone: lookarounds and `$` stop at its edges.
        int rc = pcre2_match(regex->code, subject, length, search_from, PCRE2_NO_UTF_CHECK,
                             match_data.get(), context.get());
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
          rc = pcre2_match(regex->code, subject, length, search_from,
                           PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, match_data.get(), context.get());
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          fail("pre-tokenizer: regex match failed with PCRE2 error {} on a piece of {} bytes", rc,
               length);
        }
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data.get());
        const size_t match_begin = ovector[0];
        const size_t match_end = ovector[1];
        if (match_end == match_begin) {
          // None of the patterns match empty; if one ever does, step over one code point.
          search_from = match_begin + unicode::sequence_length(subject[match_begin]);
          continue;
        }
        if (match_begin > unmatched_from) {
          next.push_back({piece.begin + unmatched_from, piece.begin + match_begin});
        }
        next.push_back({piece.begin + match_begin, piece.begin + match_end});
        unmatched_from = search_from = match_end;
      }
      if (unmatched_from < length) next.push_back({piece.begin + unmatched_from, piece.end});
    }
    std::swap(pieces, next);
  }

  std::vector<std::string> words;
  words.reserve(pieces.size());
  for (const Span& piece : pieces) {
    words.emplace_back(normalized.text, piece.begin, piece.end - piece.begin);
  }
  return words;
}

}  // namespace sieve::tok
