#include "hf/hf_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <limits>
#include <unordered_map>

#include "hf/hf_model.h"
#include "hf/json_file.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace sieve::hf {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The GGUF keys written, in one place.
constexpr std::string_view kModelKey = "tokenizer.ggml.model";
constexpr std::string_view kPreKey = "tokenizer.ggml.pre";
constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";
constexpr std::string_view kTypesKey = "tokenizer.ggml.token_type";
constexpr std::string_view kScoresKey = "tokenizer.ggml.scores";
constexpr std::string_view kMergesKey = "tokenizer.ggml.merges";
constexpr std::string_view kAddBosKey = "tokenizer.ggml.add_bos_token";
constexpr std::string_view kAddEosKey = "tokenizer.ggml.add_eos_token";
constexpr std::string_view kAddSpacePrefixKey = "tokenizer.ggml.add_space_prefix";
constexpr std::string_view kChatTemplateKey = "tokenizer.chat_template";
// sieve's own: llama.cpp has no key for a normalizer (tok::Vocab::normalize_nfc).
constexpr std::string_view kNormalizerKey = "tokenizer.sieve.normalizer";
// sieve's own: llama.cpp has no key for added tokens' flags (tok::AddedTokenFlags).
constexpr std::string_view kAddedTokenFlagsKey = "tokenizer.sieve.added_token_flags";

// tokenizer_config.json's special tokens and the id keys they become.
struct SpecialTokenField {
  std::string_view config_field;
  std::string_view gguf_key;
};
constexpr std::array kSpecialTokenFields = {
    SpecialTokenField{"bos_token", "tokenizer.ggml.bos_token_id"},
    SpecialTokenField{"eos_token", "tokenizer.ggml.eos_token_id"},
    SpecialTokenField{"unk_token", "tokenizer.ggml.unknown_token_id"},
    SpecialTokenField{"pad_token", "tokenizer.ggml.padding_token_id"},
};

using gguf::TokenType;

// Byte-level BPE pre-tokenizers: the Split regexes of tokenizer.json (HF's spelling; a
// ByteLevel pre-tokenizer with use_regex contributes GPT-2's) and model.ignore_merges, and the
// tokenizer.ggml.pre family of src/tokenizer/pretokenizer.cc that splits and merges the same.
constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen35Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N})"
    R"(| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct KnownPreTokenizer {
  std::string_view regex;
  bool ignore_merges;
  std::string_view pre;
};
constexpr std::array kPreTokenizers = {
    KnownPreTokenizer{kLlama3Regex, true, "llama-bpe"},
    KnownPreTokenizer{kLlama3Regex, false, "smaug-bpe"},
    KnownPreTokenizer{kQwen2Regex, false, "qwen2"},
    KnownPreTokenizer{kQwen35Regex, false, "qwen35"},
    KnownPreTokenizer{kGpt2Regex, false, "gpt-2"},
};

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Reading JSON values with errors naming the file and the field.
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}
  const std::string& path() const { return path_; }

  template <typename... Args>
  [[noreturn]] void error(fmt::format_string<Args...> format, Args&&... args) const {
    fail("{}: {}", path_, fmt::format(format, std::forward<Args>(args)...));
  }
  // The member, or nullptr when it is absent or null.
  static const json* member(const json& object, std::string_view key) {
    if (!object.is_object()) return nullptr;
    const auto it = object.find(key);
    return it == object.end() || it->is_null() ? nullptr : &*it;
  }
  const json& object(const json& parent, std::string_view key, std::string_view where) const {
    const json* value = member(parent, key);
    if (value == nullptr) error("{} has no \"{}\"", where.empty() ? "the file" : where, key);
    if (!value->is_object())
      error("{} is {}, expected an object", field(where, key), brief(*value));
    return *value;
  }
  const json& array(const json& parent, std::string_view key, std::string_view where) const {
    const json* value = member(parent, key);
    if (value == nullptr) error("{} has no \"{}\"", where.empty() ? "the file" : where, key);
    if (!value->is_array()) error("{} is {}, expected a list", field(where, key), brief(*value));
    return *value;
  }
  std::string string(const json& value, std::string_view what) const {
    if (!value.is_string()) error("{} is {}, expected a string", what, brief(value));
    return value.get<std::string>();
  }
  std::optional<std::string> string(const json& parent, std::string_view key,
                                    std::string_view where) const {
    const json* value = member(parent, key);
    if (value == nullptr) return std::nullopt;
    return string(*value, field(where, key));
  }
  std::optional<bool> boolean(const json& parent, std::string_view key,
                              std::string_view where) const {
    const json* value = member(parent, key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_boolean())
      error("{} is {}, expected true or false", field(where, key), brief(*value));
    return value->get<bool>();
  }
  // A token id: a non-negative integer below 2^31.
  int32_t id(const json& value, std::string_view what) const {
    if (!value.is_number_unsigned() ||
        value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max() - 1))
      error("{} is {}, expected a token id (0 .. 2^31-2)", what, brief(value));
    return static_cast<int32_t>(value.get<uint64_t>());
  }
  // "where.key", or "key" for a field of the file itself (where is "").
  static std::string field(std::string_view where, std::string_view key) {
    return where.empty() ? std::string(key) : fmt::format("{}.{}", where, key);
  }
  static std::string brief(const json& value) {
    std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
    if (text.size() > 80) text = text.substr(0, 77) + "...";
    return text;
  }

 private:
  std::string path_;
};

// One pre-tokenizer, normalizer, decoder or post-processor, or the steps of its Sequence.
std::vector<const json*> steps(const Reader& file, const json* value, std::string_view list_key,
                               std::string_view where) {
  std::vector<const json*> out;
  if (value == nullptr) return out;
  if (!value->is_object()) file.error("{} is {}, expected an object", where, Reader::brief(*value));
  if (file.string(*value, "type", where) == "Sequence") {
    for (const json& step : file.array(*value, list_key, where)) {
      if (!step.is_object())
        file.error("{} holds {}, expected an object", where, Reader::brief(step));
      if (!step.contains("type")) file.error("a step of {} has no \"type\"", where);
      out.push_back(&step);
    }
  } else {
    if (!value->contains("type")) file.error("{} has no \"type\"", where);
    out.push_back(value);
  }
  return out;
}

std::string type_of(const Reader& file, const json& step, std::string_view where) {
  return file.string(step["type"], fmt::format("{}.type", where));
}

// A Split / Replace pattern: {"Regex": ...} or {"String": ...}.
struct Pattern {
  bool regex = false;
  std::string text;
};
Pattern pattern_of(const Reader& file, const json& step, std::string_view where) {
  const json& pattern = file.object(step, "pattern", where);
  if (const json* regex = Reader::member(pattern, "Regex"))
    return {true, file.string(*regex, fmt::format("{}.pattern.Regex", where))};
  if (const json* text = Reader::member(pattern, "String"))
    return {false, file.string(*text, fmt::format("{}.pattern.String", where))};
  file.error("{}.pattern has neither \"Regex\" nor \"String\"", where);
}

bool is_replace(const Reader& file, const json& step, std::string_view where, std::string_view from,
                std::string_view to) {
  if (type_of(file, step, where) != "Replace") return false;
  const Pattern pattern = pattern_of(file, step, where);
  return !pattern.regex && pattern.text == from && file.string(step, "content", where) == to;
}

struct Token {
  std::string text;
  TokenType type = TokenType::kNormal;
  bool assigned = false;
  tok::AddedTokenFlags flags;  // added tokens' lstrip / rstrip / single_word
};

// The decided shape of the tokenizer.
struct Layout {
  bool spm = false;  // "llama": SentencePiece-style BPE with byte fallback
  std::string pre = "default";
  bool add_space_prefix = false;  // spm only
  bool nfc = false;               // the text is composed (NFC) first
};

// Byte-level BPE: the pre-tokenizer family, checked normalizer and decoder.
void read_byte_level(const Reader& file, const json& tokenizer, bool ignore_merges,
                     Layout& layout) {
  for (const json* step :
       steps(file, Reader::member(tokenizer, "normalizer"), "normalizers", "normalizer")) {
    const std::string type = type_of(file, *step, "normalizer");
    if (type != "NFC")
      file.error("normalizer '{}' is not supported for a byte-level BPE tokenizer", type);
    layout.nfc = true;
  }
  std::string regexes;  // joined by "\n" (a pattern with a newline is not in the table)
  bool byte_level = false;
  for (const json* step :
       steps(file, Reader::member(tokenizer, "pre_tokenizer"), "pretokenizers", "pre_tokenizer")) {
    const std::string type = type_of(file, *step, "pre_tokenizer");
    if (type == "Split") {
      const Pattern pattern = pattern_of(file, *step, "pre_tokenizer");
      const std::string behavior = file.string(*step, "behavior", "pre_tokenizer").value_or("");
      if (!pattern.regex || behavior != "Isolated" ||
          file.boolean(*step, "invert", "pre_tokenizer").value_or(false)) {
        file.error(
            "pre_tokenizer Split of {} '{}' with behavior '{}' is not supported (sieve splits "
            "on regexes, isolating the matches)",
            pattern.regex ? "regex" : "string", pattern.text, behavior);
      }
      regexes += (regexes.empty() ? "" : "\n") + pattern.text;
    } else if (type == "ByteLevel") {
      if (file.boolean(*step, "add_prefix_space", "pre_tokenizer").value_or(true))
        file.error("pre_tokenizer ByteLevel with add_prefix_space is not supported");
      if (file.boolean(*step, "use_regex", "pre_tokenizer").value_or(true))
        regexes += (regexes.empty() ? "" : "\n") + std::string(kGpt2Regex);
      byte_level = true;
    } else {
      file.error("pre_tokenizer '{}' is not supported for a BPE tokenizer without byte fallback",
                 type);
    }
  }
  if (!byte_level)
    file.error("a BPE tokenizer without byte fallback needs the ByteLevel pre_tokenizer");
  const auto known = std::find_if(kPreTokenizers.begin(), kPreTokenizers.end(), [&](auto& entry) {
    return entry.regex == regexes && entry.ignore_merges == ignore_merges;
  });
  if (known == kPreTokenizers.end()) {
    file.error(
        "the pre_tokenizer's regex '{}'{} is not one sieve knows (sieve knows Llama 3's, "
        "Qwen 2's, Qwen 3.5's and GPT-2's)",
        regexes, ignore_merges ? " with ignore_merges" : "");
  }
  layout.pre = known->pre;
  for (const json* step :
       steps(file, Reader::member(tokenizer, "decoder"), "decoders", "decoder")) {
    const std::string type = type_of(file, *step, "decoder");
    if (type != "ByteLevel")
      file.error("decoder '{}' is not supported for a byte-level BPE tokenizer", type);
  }
}

// SentencePiece-style BPE: spaces written as U+2581, a space in front of the text or not.
void read_spm(const Reader& file, const json& tokenizer, Layout& layout) {
  layout.spm = true;
  bool spaces_escaped = false;
  for (const json* step :
       steps(file, Reader::member(tokenizer, "normalizer"), "normalizers", "normalizer")) {
    const std::string type = type_of(file, *step, "normalizer");
    if (type == "Prepend" && !spaces_escaped &&
        file.string(*step, "prepend", "normalizer") == kSpmSpace) {
      layout.add_space_prefix = true;
    } else if (is_replace(file, *step, "normalizer", " ", kSpmSpace)) {
      spaces_escaped = true;
    } else {
      file.error("normalizer '{}' is not supported for a SentencePiece-style tokenizer", type);
    }
  }
  for (const json* step :
       steps(file, Reader::member(tokenizer, "pre_tokenizer"), "pretokenizers", "pre_tokenizer")) {
    const std::string type = type_of(file, *step, "pre_tokenizer");
    if (type == "Metaspace" && !spaces_escaped &&
        file.string(*step, "replacement", "pre_tokenizer") == kSpmSpace &&
        !file.boolean(*step, "split", "pre_tokenizer").value_or(true)) {
      const std::string scheme =
          file.string(*step, "prepend_scheme", "pre_tokenizer").value_or("always");
      // sieve puts the space in front of the text and after every special token in it, as
      // "always" does; "first" would put it in front of the text only.
      if (scheme == "first")
        file.error("pre_tokenizer Metaspace with prepend_scheme 'first' is not supported");
      layout.add_space_prefix = scheme == "always";
      spaces_escaped = true;
      continue;
    }
    // Splitting on " " after the normalizer made every space U+2581 finds nothing to split.
    if (type == "Split" && spaces_escaped) {
      const Pattern pattern = pattern_of(file, *step, "pre_tokenizer");
      if (!pattern.regex && pattern.text == " ") continue;
    }
    file.error("pre_tokenizer '{}' is not supported for a SentencePiece-style tokenizer", type);
  }
  if (!spaces_escaped) {
    file.error(
        "a BPE tokenizer with byte fallback needs a normalizer or Metaspace pre_tokenizer that "
        "writes spaces as U+2581");
  }
  for (const json* step :
       steps(file, Reader::member(tokenizer, "decoder"), "decoders", "decoder")) {
    const std::string type = type_of(file, *step, "decoder");
    if (type == "ByteFallback" || type == "Fuse" || type == "Metaspace" ||
        is_replace(file, *step, "decoder", kSpmSpace, " ")) {
      continue;
    }
    // Strip one leading space: the one the encoder put in front (sieve's decode drops it).
    if (type == "Strip" && layout.add_space_prefix &&
        file.string(*step, "content", "decoder") == " " && step->value("start", json()) == 1 &&
        step->value("stop", json()) == 0) {
      continue;
    }
    file.error("decoder '{}' is not supported for a SentencePiece-style tokenizer", type);
  }
}

// model.merges in either form: "a b" strings or [a, b] pairs.
std::vector<std::pair<std::string, std::string>> read_merges(const Reader& file,
                                                             const json& model) {
  std::vector<std::pair<std::string, std::string>> merges;
  const json* list = Reader::member(model, "merges");
  if (list == nullptr) return merges;
  if (!list->is_array()) file.error("model.merges is {}, expected a list", Reader::brief(*list));
  merges.reserve(list->size());
  for (size_t rank = 0; rank < list->size(); ++rank) {
    const json& merge = (*list)[rank];
    if (merge.is_string()) {
      const std::string& text = merge.get_ref<const std::string&>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == text.size() ||
          text.find(' ', space + 1) != std::string::npos) {
        file.error("model.merges[{}] is {}, expected two tokens separated by a space", rank,
                   Reader::brief(merge));
      }
      merges.emplace_back(text.substr(0, space), text.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      file.error("model.merges[{}] is {}, expected \"a b\" or [\"a\", \"b\"]", rank,
                 Reader::brief(merge));
    }
  }
  return merges;
}

// The id of a special token named in tokenizer_config.json: a string or an AddedToken object.
std::optional<int32_t> special_token_id(const Reader& config, const json& value,
                                        std::string_view field,
                                        const std::unordered_map<std::string, int32_t>& ids) {
  const json* content = &value;
  if (value.is_object()) {
    content = Reader::member(value, "content");
    if (content == nullptr) config.error("{} has no \"content\"", field);
  }
  const std::string text = config.string(*content, field);
  const auto it = ids.find(text);
  if (it == ids.end()) config.error("{} '{}' is not a token of tokenizer.json", field, text);
  return it->second;
}

// config.json's bos_token_id / eos_token_id: an id, or a list of ids of which the first is the
// token (the others, for EOS, are stop ids: generation_config.h); std::nullopt when absent.
std::optional<int32_t> model_config_token_id(const Reader& config, const json& value,
                                             std::string_view field, size_t num_tokens) {
  const json* first = &value;
  if (value.is_array()) {
    if (value.empty()) return std::nullopt;
    first = &value[0];
  }
  const int32_t id = config.id(*first, field);
  if (static_cast<size_t>(id) >= num_tokens)
    config.error("{} {} is not a token id of tokenizer.json ({} tokens)", field, id, num_tokens);
  return id;
}

gguf::Value string_array(std::vector<std::string> items) {
  gguf::Array array{gguf::ValueType::kString, {}};
  array.items.reserve(items.size());
  for (std::string& item : items) array.items.push_back({std::move(item)});
  return {std::move(array)};
}

}  // namespace

std::vector<gguf::KeyValue> tokenizer_metadata(const TokenizerTexts& texts,
                                               const std::string& folder,
                                               std::optional<uint64_t> vocab_size) {
  if (texts.tokenizer_json.empty()) return {};
  const Reader file((fs::path(folder) / "tokenizer.json").string());
  const Reader config_file((fs::path(folder) / "tokenizer_config.json").string());
  const json tokenizer = parse_json(texts.tokenizer_json, file.path(), "the file");
  const json config = texts.tokenizer_config_json.empty()
                          ? json::object()
                          : parse_json(texts.tokenizer_config_json, config_file.path(), "the file");
  const Reader model_config_file((fs::path(folder) / "config.json").string());
  const json model_config =
      texts.config_json.empty()
          ? json::object()
          : parse_json(texts.config_json, model_config_file.path(), "the file");
  if (!tokenizer.is_object()) file.error("not a JSON object");
  if (!config.is_object()) config_file.error("not a JSON object");
  if (!model_config.is_object()) model_config_file.error("not a JSON object");

  // The model: BPE, plain or with byte fallback.
  const json& model = file.object(tokenizer, "model", "");
  const std::string model_type = file.string(model, "type", "model").value_or("BPE");
  if (model_type != "BPE") {
    file.error(
        "model type '{}' is not supported (sieve reads BPE tokenizers: byte-level, or "
        "SentencePiece-style with byte fallback)",
        model_type);
  }
  if (Reader::member(model, "dropout") != nullptr) file.error("BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!file.string(model, key, "model").value_or("").empty())
      file.error("BPE {} is not supported", key);
  }
  const bool byte_fallback = file.boolean(model, "byte_fallback", "model").value_or(false);
  const bool ignore_merges = file.boolean(model, "ignore_merges", "model").value_or(false);
  Layout layout;
  if (byte_fallback) {
    if (ignore_merges) file.error("BPE ignore_merges with byte_fallback is not supported");
    read_spm(file, tokenizer, layout);
  } else {
    read_byte_level(file, tokenizer, ignore_merges, layout);
  }

  // Tokens: model.vocab, then added_tokens (which may repeat a vocab entry's id).
  std::vector<Token> tokens;
  auto place = [&](int32_t id, std::string text, TokenType type, std::string_view what,
                   tok::AddedTokenFlags flags) {
    if (static_cast<size_t>(id) >= tokens.size()) tokens.resize(static_cast<size_t>(id) + 1);
    Token& token = tokens[id];
    if (token.assigned && token.text != text)
      file.error("{} gives id {} to '{}', which is '{}' already", what, id, text, token.text);
    token = {std::move(text), type, true, flags};
  };
  const json& vocab = file.object(model, "vocab", "model");
  for (const auto& [text, id] : vocab.items()) {
    TokenType type = TokenType::kNormal;
    if (layout.spm && text.size() == 6 && text.starts_with("<0x") && text.back() == '>' &&
        std::isxdigit(static_cast<unsigned char>(text[3])) &&
        std::isxdigit(static_cast<unsigned char>(text[4]))) {
      type = TokenType::kByte;
    }
    place(file.id(id, fmt::format("model.vocab['{}']", text)), text, type, "model.vocab", {});
  }
  if (const json* added = Reader::member(tokenizer, "added_tokens")) {
    if (!added->is_array())
      file.error("added_tokens is {}, expected a list", Reader::brief(*added));
    for (size_t i = 0; i < added->size(); ++i) {
      const std::string where = fmt::format("added_tokens[{}]", i);
      const json& entry = (*added)[i];
      if (!entry.is_object())
        file.error("{} is {}, expected an object", where, Reader::brief(entry));
      const json* id = Reader::member(entry, "id");
      const json* content = Reader::member(entry, "content");
      if (id == nullptr || content == nullptr) file.error("{} needs \"id\" and \"content\"", where);
      const std::string text = file.string(*content, where + ".content");
      // Matched with the white space around it, or as a whole word only (Phi-3's chat tokens
      // take the white space after them).
      const tok::AddedTokenFlags flags{file.boolean(entry, "lstrip", where).value_or(false),
                                       file.boolean(entry, "rstrip", where).value_or(false),
                                       file.boolean(entry, "single_word", where).value_or(false)};
      const bool special = file.boolean(entry, "special", where).value_or(false);
      place(file.id(*id, where + ".id"), text,
            special ? TokenType::kControl : TokenType::kUserDefined, "added_tokens", flags);
    }
  }
  if (tokens.empty()) file.error("model.vocab has no tokens");
  if (vocab_size && *vocab_size > tokens.size()) {
    // The model has more rows than the tokenizer has tokens (rows kept for alignment).
    if (*vocab_size > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
      fail("vocab_size {} is out of range", *vocab_size);
    tokens.resize(*vocab_size);
  }
  std::unordered_map<std::string, int32_t> ids;
  ids.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    Token& token = tokens[id];
    if (!token.assigned) token = {fmt::format("[PAD{}]", id), TokenType::kUnused, true};
    ids.emplace(token.text, static_cast<int32_t>(id));
  }
  if (const auto unk = file.string(model, "unk_token", "model")) {
    const auto it = ids.find(*unk);
    if (it == ids.end()) file.error("model.unk_token '{}' is not a token", *unk);
    tokens[it->second].type = TokenType::kUnknown;
  }

  std::vector<gguf::KeyValue> out;
  auto set = [&](std::string_view key, gguf::Value value) {
    out.push_back({std::string(key), std::move(value)});
  };
  set(kModelKey, {std::string(layout.spm ? "llama" : "gpt2")});
  set(kPreKey, {layout.pre});
  if (layout.nfc) set(kNormalizerKey, {std::string("NFC")});

  const std::vector<std::pair<std::string, std::string>> merges = read_merges(file, model);
  if (layout.spm) {
    // SentencePiece-style merging takes any pair whose text is a token, the highest score
    // first: -(rank of the first merge giving a token) merges in tokenizer.json's order; tokens
    // no merge gives come after every merge.
    const float last = -static_cast<float>(merges.size()) - 1.0f;
    std::vector<float> scores(tokens.size(), last);
    for (size_t rank = merges.size(); rank-- > 0;) {
      const auto it = ids.find(merges[rank].first + merges[rank].second);
      if (it != ids.end()) scores[it->second] = -static_cast<float>(rank);
    }
    gguf::Array array{gguf::ValueType::kFloat32, {}};
    for (float score : scores) array.items.push_back({score});
    set(kScoresKey, {std::move(array)});
    set(kAddSpacePrefixKey, {layout.add_space_prefix});
  } else {
    std::vector<std::string> lines;
    lines.reserve(merges.size());
    for (const auto& [left, right] : merges) {
      if (left.find(' ') != std::string::npos || right.find(' ') != std::string::npos)
        file.error("merge ['{}', '{}'] holds a space, which a byte-level token cannot", left,
                   right);
      lines.push_back(left + " " + right);
    }
    set(kMergesKey, string_array(std::move(lines)));
  }

  // Special tokens and whether BOS/EOS are added: tokenizer_config.json, else config.json's
  // ids (as the converter falls back to them), else what the post-processor adds (as the
  // converter infers it).
  std::optional<int32_t> bos, eos;
  for (const SpecialTokenField& field : kSpecialTokenFields) {
    const json* value = Reader::member(config, field.config_field);
    std::optional<int32_t> id;
    if (value != nullptr) {
      id = special_token_id(config_file, *value, field.config_field, ids);
    } else if (field.config_field == "bos_token" || field.config_field == "eos_token") {
      const std::string id_field = fmt::format("{}_id", field.config_field);
      if (const json* model_value = Reader::member(model_config, id_field))
        id = model_config_token_id(model_config_file, *model_value, id_field, tokens.size());
    }
    if (field.config_field == "unk_token" && !id) {
      if (const auto unk = file.string(model, "unk_token", "model")) id = ids.at(*unk);
    }
    if (field.config_field == "bos_token") bos = id;
    if (field.config_field == "eos_token") eos = id;
    if (id) set(field.gguf_key, {static_cast<uint32_t>(*id)});
  }
  std::optional<bool> add_bos = config_file.boolean(config, "add_bos_token", "");
  std::optional<bool> add_eos = config_file.boolean(config, "add_eos_token", "");
  for (const json* step :
       steps(file, Reader::member(tokenizer, "post_processor"), "processors", "post_processor")) {
    const std::string type = type_of(file, *step, "post_processor");
    if (type == "ByteLevel") continue;  // offsets only
    if (type != "TemplateProcessing") {
      file.error("post_processor '{}' is not supported (sieve adds at most BOS and EOS)", type);
    }
    const json& single = file.array(*step, "single", "post_processor");
    auto special_at = [&](size_t index) -> std::optional<int32_t> {
      const json* special = Reader::member(single[index], "SpecialToken");
      if (special == nullptr) return std::nullopt;
      const std::string name = file.string(*special, "id", "post_processor.single").value_or("");
      const auto it = ids.find(name);
      if (it == ids.end()) file.error("post_processor adds '{}', which is not a token", name);
      return it->second;
    };
    if (single.size() < 2) continue;
    const std::optional<int32_t> first = special_at(0), last = special_at(single.size() - 1);
    if (!add_bos) add_bos = first.has_value();
    if (!add_eos) add_eos = last.has_value();
    if (first && !bos) {
      bos = first;
      set("tokenizer.ggml.bos_token_id", {static_cast<uint32_t>(*first)});
    }
    if (last && !eos) {
      eos = last;
      set("tokenizer.ggml.eos_token_id", {static_cast<uint32_t>(*last)});
    }
  }
  set(kAddBosKey, {add_bos.value_or(false)});
  set(kAddEosKey, {add_eos.value_or(false)});

  std::vector<std::string> texts_out;
  std::vector<int32_t> types, flags;
  texts_out.reserve(tokens.size());
  types.reserve(tokens.size());
  flags.reserve(tokens.size());
  for (Token& token : tokens) {
    texts_out.push_back(std::move(token.text));
    types.push_back(static_cast<int32_t>(token.type));
    flags.push_back(token.flags.bits());
  }
  set(kTokensKey, string_array(std::move(texts_out)));
  gguf::Array type_array{gguf::ValueType::kInt32, {}};
  for (int32_t type : types) type_array.items.push_back({type});
  set(kTypesKey, {std::move(type_array)});
  // Only when a token has a flag: every other tokenizer's keys stay as llama.cpp writes them.
  if (std::any_of(flags.begin(), flags.end(), [](int32_t bits) { return bits != 0; })) {
    gguf::Array flag_array{gguf::ValueType::kInt32, {}};
    for (int32_t bits : flags) flag_array.items.push_back({bits});
    set(kAddedTokenFlagsKey, {std::move(flag_array)});
  }

  // Chat templates: chat_template.jinja, else tokenizer_config.json's (a string, or named
  // templates of which "default" is the template and the others tokenizer.chat_template.<name>).
  std::optional<std::string> chat_template;
  if (!texts.chat_template_jinja.empty()) chat_template = texts.chat_template_jinja;
  if (const json* value = Reader::member(config, "chat_template")) {
    if (value->is_string()) {
      if (!chat_template) chat_template = value->get<std::string>();
    } else if (value->is_array()) {
      for (const json& entry : *value) {
        const std::string name = config_file.string(entry, "name", "chat_template[]").value_or("");
        const json* text = Reader::member(entry, "template");
        if (name.empty() || text == nullptr)
          config_file.error("chat_template entries need \"name\" and \"template\"");
        const std::string source = config_file.string(*text, "chat_template[].template");
        if (name == "default") {
          if (!chat_template) chat_template = source;
        } else {
          set(fmt::format("{}.{}", kChatTemplateKey, name), {source});
        }
      }
    } else {
      config_file.error("chat_template is {}, expected a string or a list", Reader::brief(*value));
    }
  }
  if (chat_template) set(kChatTemplateKey, {*chat_template});
  return out;
}

namespace {

// The file's text, "" when it does not exist.
std::string read_optional(const fs::path& path) {
  std::error_code error;
  if (!fs::exists(path, error)) return {};
  const uint64_t size = fs::file_size(path, error);
  if (error) fail("cannot read '{}': {}", path.string(), error.message());
  if (size > kMaxJsonFileBytes)
    fail("'{}' is {} bytes, over the {} byte limit", path.string(), size, kMaxJsonFileBytes);
  std::ifstream in(path, std::ios::binary);
  std::string text(size, '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (!in || static_cast<uint64_t>(in.gcount()) != size) fail("cannot read '{}'", path.string());
  return text;
}

}  // namespace

std::vector<gguf::KeyValue> tokenizer_metadata(const std::string& folder,
                                               std::optional<uint64_t> vocab_size) {
  const fs::path dir(folder);
  TokenizerTexts texts{
      read_optional(dir / "tokenizer.json"), read_optional(dir / "tokenizer_config.json"),
      read_optional(dir / "chat_template.jinja"), read_optional(dir / "config.json")};
  return tokenizer_metadata(texts, folder, vocab_size);
}

gguf::File open_tokenizer_folder(const std::string& path) {
  const std::string folder = model_folder(path);
  std::optional<uint64_t> vocab_size;
  const fs::path config_path = fs::path(folder) / "config.json";
  if (fs::exists(config_path)) {
    const json config = read_json_file(config_path.string());
    if (const json* size = Reader::member(config, "vocab_size"); size && size->is_number_unsigned())
      vocab_size = size->get<uint64_t>();
  }
  std::vector<gguf::KeyValue> metadata = tokenizer_metadata(folder, vocab_size);
  if (metadata.empty()) fail("'{}' has no tokenizer.json", folder);
  return gguf::File::assemble(std::move(metadata), {}, nullptr);
}

}  // namespace sieve::hf
