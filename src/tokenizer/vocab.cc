// Loading vocabularies (GGUF tokenizer.ggml.* keys, llama2.c tokenizer files) and checking them.
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "gguf/gguf.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "util/error.h"
#include "util/mapped_file.h"

namespace sieve::tok {
namespace {

constexpr std::string_view kModelKey = "tokenizer.ggml.model";
constexpr std::string_view kPreKey = "tokenizer.ggml.pre";
constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";
constexpr std::string_view kScoresKey = "tokenizer.ggml.scores";
constexpr std::string_view kTypesKey = "tokenizer.ggml.token_type";
constexpr std::string_view kMergesKey = "tokenizer.ggml.merges";
constexpr std::string_view kAddBosKey = "tokenizer.ggml.add_bos_token";
constexpr std::string_view kAddEosKey = "tokenizer.ggml.add_eos_token";
constexpr std::string_view kAddSpacePrefixKey = "tokenizer.ggml.add_space_prefix";
constexpr std::string_view kNormalizerKey = "tokenizer.sieve.normalizer";
constexpr std::string_view kAddedTokenFlagsKey = "tokenizer.sieve.added_token_flags";

TokenType to_token_type(int32_t value) {
  if (value < static_cast<int32_t>(TokenType::kUndefined) ||
      value > static_cast<int32_t>(TokenType::kByte)) {
    return TokenType::kUndefined;
  }
  return static_cast<TokenType>(value);
}

// tokenizer.ggml.scores: float32 (or, in some converters' output, int32) per token.
std::optional<std::vector<float>> read_scores(const gguf::File& file) {
  const gguf::Value* value = file.find(kScoresKey);
  if (value == nullptr) return std::nullopt;
  const auto* array = std::get_if<gguf::Array>(&value->data);
  if (array != nullptr && array->elem_type == gguf::ValueType::kInt32) {
    std::vector<float> scores;
    scores.reserve(array->items.size());
    for (const gguf::Value& item : array->items) {
      const auto* score = std::get_if<int32_t>(&item.data);
      if (score == nullptr) fail("{}: an item of an int32 array is not an int32", kScoresKey);
      scores.push_back(static_cast<float>(*score));
    }
    return scores;
  }
  return file.get_f32_array(kScoresKey);  // throws naming the key for any other type
}

// A special-token id key: absent, or 0xFFFFFFFF / -1 ("none", as llama.cpp's converters write
// it) -> std::nullopt; any other value must index a token.
std::optional<TokenId> read_token_id(const gguf::File& file, std::string_view key,
                                     size_t num_tokens) {
  const std::optional<int64_t> value = file.get_i64(key);
  if (!value || *value == -1 || *value == std::numeric_limits<uint32_t>::max()) {
    return std::nullopt;
  }
  if (*value < 0 || static_cast<uint64_t>(*value) >= num_tokens) {
    fail("{} = {} is out of range: the vocabulary has {} tokens", key, *value, num_tokens);
  }
  return static_cast<TokenId>(*value);
}

// llama2.c stores its special tokens with newlines around them ("\n<s>\n"); the GGUF
// conversion names them as SentencePiece does.
constexpr std::string_view kLlama2cSpecialNames[] = {"<unk>", "<s>", "</s>"};

class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> bytes, const std::string& path)
      : bytes_(bytes), path_(path) {}

  template <typename T>
  T read(std::string_view what) {
    T value;
    std::memcpy(&value, take(sizeof(T), what).data(), sizeof(T));
    return value;
  }
  std::span<const uint8_t> take(size_t count, std::string_view what) {
    if (count > bytes_.size() - offset_) {
      fail(
          "'{}' is not a llama2.c tokenizer file: truncated at byte {} reading {} ({} bytes "
          "needed, {} left)",
          path_, offset_, what, count, bytes_.size() - offset_);
    }
    auto out = bytes_.subspan(offset_, count);
    offset_ += count;
    return out;
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& path_;
  size_t offset_ = 0;
};

}  // namespace

Vocab load_vocab(const gguf::File& file) {
  Vocab vocab;
  const std::optional<std::string> model = file.get_string(kModelKey);
  if (!model) fail("the GGUF has no tokenizer: key {} is missing", kModelKey);
  if (*model == "llama") {
    vocab.kind = VocabKind::kSpm;
  } else if (*model == "gpt2") {
    vocab.kind = VocabKind::kBpe;
  } else {
    fail(
        "unsupported tokenizer '{}' ({}): sieve supports 'llama' (SentencePiece) and 'gpt2' "
        "(byte-level BPE)",
        *model, kModelKey);
  }
  vocab.pre = file.get_string(kPreKey).value_or("default");

  std::optional<std::vector<std::string>> tokens = file.get_string_array(kTokensKey);
  if (!tokens) fail("the GGUF has no token list: key {} is missing", kTokensKey);
  if (tokens->empty()) fail("{} is empty", kTokensKey);
  vocab.tokens = std::move(*tokens);
  const size_t num_tokens = vocab.tokens.size();

  if (auto scores = read_scores(file)) {
    if (scores->size() != num_tokens) {
      fail("{} has {} entries but {} has {}", kScoresKey, scores->size(), kTokensKey, num_tokens);
    }
    vocab.scores = std::move(*scores);
  } else if (vocab.kind == VocabKind::kSpm) {
    vocab.scores.assign(num_tokens, 0.0f);
  }

  if (auto types = file.get_i32_array(kTypesKey)) {
    if (types->size() != num_tokens) {
      fail("{} has {} entries but {} has {}", kTypesKey, types->size(), kTokensKey, num_tokens);
    }
    vocab.types.reserve(num_tokens);
    for (int32_t type : *types) vocab.types.push_back(to_token_type(type));
  } else {
    vocab.types.assign(num_tokens, TokenType::kNormal);
  }

  if (vocab.kind == VocabKind::kBpe) {
    auto merges = file.get_string_array(kMergesKey);
    if (!merges) fail("byte-level BPE tokenizer without merges: key {} is missing", kMergesKey);
    vocab.merges = std::move(*merges);
  }

  // Special tokens; "llama" vocabularies default to SentencePiece's unk/bos/eos = 0/1/2.
  auto default_id = [&](TokenId id) -> std::optional<TokenId> {
    if (vocab.kind != VocabKind::kSpm || static_cast<size_t>(id) >= num_tokens) return {};
    return id;
  };
  auto id_or = [&](std::string_view key, std::optional<TokenId> fallback) {
    return file.find(key) != nullptr ? read_token_id(file, key, num_tokens) : fallback;
  };
  vocab.bos = id_or("tokenizer.ggml.bos_token_id", default_id(1));
  vocab.eos = id_or("tokenizer.ggml.eos_token_id", default_id(2));
  vocab.unk = id_or("tokenizer.ggml.unknown_token_id", default_id(0));
  vocab.pad = id_or("tokenizer.ggml.padding_token_id", std::nullopt);
  vocab.eot = id_or("tokenizer.ggml.eot_token_id", std::nullopt);

  bool bpe_add_bos = false;
  if (vocab.kind == VocabKind::kBpe) {
    if (auto traits = find_pre_tokenizer(vocab.pre)) bpe_add_bos = traits->add_bos;
  }
  vocab.add_bos = file.get_bool(kAddBosKey).value_or(vocab.kind == VocabKind::kSpm || bpe_add_bos);
  vocab.add_eos = file.get_bool(kAddEosKey).value_or(false);
  vocab.add_space_prefix =
      file.get_bool(kAddSpacePrefixKey).value_or(vocab.kind == VocabKind::kSpm);
  if (const std::optional<std::string> normalizer = file.get_string(kNormalizerKey)) {
    if (*normalizer != "NFC")
      fail("unsupported normalizer '{}' ({}): sieve supports 'NFC'", *normalizer, kNormalizerKey);
    vocab.normalize_nfc = true;
  }
  if (const auto flags = file.get_i32_array(kAddedTokenFlagsKey)) {
    if (flags->size() != num_tokens) {
      fail("{} has {} entries but {} has {}", kAddedTokenFlagsKey, flags->size(), kTokensKey,
           num_tokens);
    }
    constexpr int32_t kKnownBits =
        AddedTokenFlags::kLstripBit | AddedTokenFlags::kRstripBit | AddedTokenFlags::kSingleWordBit;
    vocab.added_token_flags.reserve(num_tokens);
    for (size_t id = 0; id < num_tokens; ++id) {
      const int32_t bits = (*flags)[id];
      if ((bits & ~kKnownBits) != 0)
        fail("{}[{}] is {}: sieve knows the bits {} (lstrip), {} (rstrip) and {} (single_word)",
             kAddedTokenFlagsKey, id, bits, AddedTokenFlags::kLstripBit,
             AddedTokenFlags::kRstripBit, AddedTokenFlags::kSingleWordBit);
      vocab.added_token_flags.push_back({(bits & AddedTokenFlags::kLstripBit) != 0,
                                         (bits & AddedTokenFlags::kRstripBit) != 0,
                                         (bits & AddedTokenFlags::kSingleWordBit) != 0});
    }
  }

  validate(vocab);
  return vocab;
}

Vocab load_llama2c_vocab(const std::string& path, size_t vocab_size) {
  if (vocab_size < std::size(kLlama2cSpecialNames) ||
      vocab_size > static_cast<size_t>(std::numeric_limits<TokenId>::max())) {
    fail("llama2.c vocabulary size {} for '{}' is out of range (3 .. 2^31-1)", vocab_size, path);
  }
  const MappedFile mapping = MappedFile::open(path);
  ByteReader reader(mapping.bytes(), path);
  const auto max_token_length = reader.read<int32_t>("max_token_length");
  if (max_token_length < 0) {
    fail("'{}' is not a llama2.c tokenizer file: max_token_length is {}", path, max_token_length);
  }

  Vocab vocab;
  vocab.kind = VocabKind::kSpm;
  vocab.pre = "default";
  vocab.tokens.reserve(vocab_size);
  vocab.scores.reserve(vocab_size);
  vocab.types.reserve(vocab_size);
  for (size_t id = 0; id < vocab_size; ++id) {
    const std::string what = fmt::format("token {}", id);
    const auto score = reader.read<float>(what);
    const auto length = reader.read<int32_t>(what);
    if (length < 0) fail("'{}': token {} has a negative length {}", path, id, length);
    const auto bytes = reader.take(static_cast<size_t>(length), what);
    std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());

    // The type rules of llama.cpp's llama2.c converter.
    TokenType type = TokenType::kNormal;
    if (id < std::size(kLlama2cSpecialNames)) {
      text = kLlama2cSpecialNames[id];
      type = id == 0 ? TokenType::kUnknown : TokenType::kControl;
    } else if (text.empty()) {
      type = TokenType::kControl;
    } else if (text.size() > 3 && text.starts_with("<0x") &&
               std::isxdigit(static_cast<uint8_t>(text[3]))) {
      type = TokenType::kByte;
    }
    vocab.tokens.push_back(unicode::escape_spm_spaces(text));
    vocab.scores.push_back(score);
    vocab.types.push_back(type);
  }
  vocab.unk = 0;
  vocab.bos = 1;
  vocab.eos = 2;
  vocab.add_bos = true;
  vocab.add_eos = false;
  vocab.add_space_prefix = true;
  validate(vocab);
  return vocab;
}

void validate(const Vocab& vocab) {
  const size_t n = vocab.size();
  if (n == 0) fail("the vocabulary has no tokens");
  if (n > static_cast<size_t>(std::numeric_limits<TokenId>::max())) {
    fail("the vocabulary has {} tokens; at most 2^31-1 are supported", n);
  }
  if (vocab.types.size() != n) {
    fail("the vocabulary has {} tokens but {} token types", n, vocab.types.size());
  }
  if (!vocab.scores.empty() && vocab.scores.size() != n) {
    fail("the vocabulary has {} tokens but {} scores", n, vocab.scores.size());
  }
  if (!vocab.added_token_flags.empty() && vocab.added_token_flags.size() != n) {
    fail("the vocabulary has {} tokens but {} added-token flags", n,
         vocab.added_token_flags.size());
  }
  for (size_t id = 0; id < vocab.scores.size(); ++id) {
    if (std::isnan(vocab.scores[id])) fail("token {} has a NaN score", id);
  }
  std::unordered_map<std::string_view, size_t> seen;
  seen.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    const std::string& text = vocab.tokens[id];
    if (text.empty()) continue;  // never matched; llama.cpp renames these "[EMPTY_<id>]"
    auto [it, inserted] = seen.emplace(text, id);
    if (!inserted) {
      fail("duplicate token in the vocabulary: '{}' has ids {} and {}", text, it->second, id);
    }
  }
  const std::pair<const char*, std::optional<TokenId>> ids[] = {{"bos", vocab.bos},
                                                                {"eos", vocab.eos},
                                                                {"unk", vocab.unk},
                                                                {"pad", vocab.pad},
                                                                {"eot", vocab.eot}};
  for (const auto& [name, id] : ids) {
    if (id && (*id < 0 || static_cast<size_t>(*id) >= n)) {
      fail("{} token id {} is out of range: the vocabulary has {} tokens", name, *id, n);
    }
  }
  if (vocab.add_bos && !vocab.bos) fail("the vocabulary adds BOS but has no BOS token id");
  if (vocab.add_eos && !vocab.eos) fail("the vocabulary adds EOS but has no EOS token id");
}

}  // namespace sieve::tok
