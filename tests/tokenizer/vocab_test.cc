// Loading vocabularies from GGUF metadata, and the checks on malformed ones.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "gguf/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace sieve::tok {
namespace {

gguf::Value string_array(const std::vector<std::string>& items) {
  gguf::Array array{gguf::ValueType::kString, {}};
  for (const auto& item : items) array.items.push_back(gguf::Value{item});
  return gguf::Value{std::move(array)};
}

gguf::Value f32_array(const std::vector<float>& items) {
  gguf::Array array{gguf::ValueType::kFloat32, {}};
  for (float item : items) array.items.push_back(gguf::Value{item});
  return gguf::Value{std::move(array)};
}

gguf::Value i32_array(const std::vector<int32_t>& items) {
  gguf::Array array{gguf::ValueType::kInt32, {}};
  for (int32_t item : items) array.items.push_back(gguf::Value{item});
  return gguf::Value{std::move(array)};
}

// A small, valid SPM vocabulary as GGUF metadata; tests then break one key.
gguf::Writer spm_writer() {
  gguf::Writer writer;
  writer.set_string("tokenizer.ggml.model", "llama");
  writer.set("tokenizer.ggml.tokens", string_array({"<unk>", "<s>", "</s>", "\u2581a", "a"}));
  writer.set("tokenizer.ggml.scores", f32_array({0, 0, 0, -1, -2}));
  writer.set("tokenizer.ggml.token_type", i32_array({2, 3, 3, 1, 1}));
  return writer;
}

Vocab load(const gguf::Writer& writer) {
  const std::string path =
      (std::filesystem::path(::testing::TempDir()) /
       (std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + ".gguf"))
          .string();
  writer.write(path);
  const gguf::File file = gguf::File::open(path);
  return load_vocab(file);
}

// Runs fn, expecting a sieve::Error whose message contains `needle`.
template <typename Fn>
void expect_error(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(LoadVocab, SpmDefaults) {
  const Vocab vocab = load(spm_writer());
  EXPECT_EQ(vocab.kind, VocabKind::kSpm);
  EXPECT_EQ(vocab.pre, "default");
  EXPECT_EQ(vocab.bos, 1);
  EXPECT_EQ(vocab.eos, 2);
  EXPECT_EQ(vocab.unk, 0);
  EXPECT_FALSE(vocab.pad);
  EXPECT_TRUE(vocab.add_bos);
  EXPECT_FALSE(vocab.add_eos);
  EXPECT_TRUE(vocab.add_space_prefix);
  EXPECT_EQ(vocab.types[1], TokenType::kControl);
}

TEST(LoadVocab, KeysOverrideDefaults) {
  gguf::Writer writer = spm_writer();
  writer.set_bool("tokenizer.ggml.add_bos_token", false);
  writer.set_bool("tokenizer.ggml.add_space_prefix", false);
  writer.set_u32("tokenizer.ggml.padding_token_id", 0xFFFFFFFFu);  // "none"
  writer.set_u32("tokenizer.ggml.eot_token_id", 2);
  const Vocab vocab = load(writer);
  EXPECT_FALSE(vocab.add_bos);
  EXPECT_FALSE(vocab.add_space_prefix);
  EXPECT_FALSE(vocab.pad);
  EXPECT_EQ(vocab.eot, 2);
}

TEST(LoadVocab, AddedTokenFlagsAreSievesOwnKey) {
  EXPECT_TRUE(load(spm_writer()).added_token_flags.empty());  // no key: no flags
  gguf::Writer writer = spm_writer();
  writer.set("tokenizer.sieve.added_token_flags", i32_array({0, 1, 2, 4, 7}));
  const Vocab vocab = load(writer);
  ASSERT_EQ(vocab.added_token_flags.size(), 5u);
  EXPECT_EQ(vocab.added_token_flags[0], AddedTokenFlags{});
  EXPECT_EQ(vocab.added_token_flags[1], (AddedTokenFlags{.lstrip = true}));
  EXPECT_EQ(vocab.added_token_flags[2], (AddedTokenFlags{.rstrip = true}));
  EXPECT_EQ(vocab.added_token_flags[3], (AddedTokenFlags{.single_word = true}));
  EXPECT_EQ(vocab.added_token_flags[4], (AddedTokenFlags{true, true, true}));
  const std::vector<int32_t> written = {0, 1, 2, 4, 7};
  for (size_t id = 0; id < written.size(); ++id)
    EXPECT_EQ(vocab.added_token_flags[id].bits(), written[id]);  // bits() writes what was read
}

TEST(LoadVocab, MissingOrMismatchedKeys) {
  expect_error([] { load(gguf::Writer()); }, "tokenizer.ggml.model");
  expect_error(
      [] {
        gguf::Writer writer = spm_writer();
        writer.set_string("tokenizer.ggml.model", "t5");
        load(writer);
      },
      "t5");
  expect_error(
      [] {
        gguf::Writer writer = spm_writer();
        writer.set("tokenizer.ggml.scores", f32_array({0, 0}));
        load(writer);
      },
      "tokenizer.ggml.scores");
  expect_error(
      [] {
        gguf::Writer writer = spm_writer();
        writer.set("tokenizer.ggml.token_type", i32_array({1}));
        load(writer);
      },
      "tokenizer.ggml.token_type");
  expect_error(
      [] {
        gguf::Writer writer = spm_writer();
        writer.set_u32("tokenizer.ggml.bos_token_id", 5);
        load(writer);
      },
      "tokenizer.ggml.bos_token_id");
  expect_error(
      [] {
        gguf::Writer writer = spm_writer();
        writer.set("tokenizer.ggml.tokens", string_array({"a", "b", "a", "c", "d"}));
        load(writer);
      },
      "duplicate");
  expect_error(
      [] {
        gguf::Writer writer = spm_writer();
        writer.set_string("tokenizer.ggml.model", "gpt2");
        load(writer);  // no merges
      },
      "tokenizer.ggml.merges");
  expect_error(
      [] {
        gguf::Writer writer = spm_writer();
        writer.set("tokenizer.sieve.added_token_flags", i32_array({0, 2}));
        load(writer);
      },
      "tokenizer.sieve.added_token_flags has 2 entries but tokenizer.ggml.tokens has 5");
  expect_error(
      [] {
        gguf::Writer writer = spm_writer();
        writer.set("tokenizer.sieve.added_token_flags", i32_array({0, 8, 0, 0, 0}));
        load(writer);
      },
      "tokenizer.sieve.added_token_flags[1] is 8");
}

TEST(LoadVocab, BpeWithUnknownPreTokenizerFailsAtCreate) {
  gguf::Writer writer;
  writer.set_string("tokenizer.ggml.model", "gpt2");
  writer.set_string("tokenizer.ggml.pre", "no-such-pre");
  writer.set("tokenizer.ggml.tokens", string_array({"a", "b", "ab"}));
  writer.set("tokenizer.ggml.merges", string_array({"a b"}));
  const Vocab vocab = load(writer);
  EXPECT_FALSE(vocab.add_bos);
  EXPECT_FALSE(vocab.add_space_prefix);
  expect_error([&] { Tokenizer::create(vocab); }, "no-such-pre");
}

TEST(LoadVocab, TinyBpeVocabulary) {
  gguf::Writer writer;
  writer.set_string("tokenizer.ggml.model", "gpt2");
  writer.set_string("tokenizer.ggml.pre", "gpt-2");
  writer.set("tokenizer.ggml.tokens", string_array({"a", "b", "ab", "\u0120", "\u0120ab"}));
  writer.set("tokenizer.ggml.merges", string_array({"a b", "\u0120 ab"}));
  auto tokenizer = Tokenizer::create(load(writer));
  EXPECT_EQ(tokenizer->encode("ab ab"), (std::vector<TokenId>{2, 4}));
  EXPECT_EQ(tokenizer->decode(std::vector<TokenId>{2, 4}), "ab ab");
  // "c" is not in the vocabulary and there is no unk: it is dropped, as llama.cpp does.
  EXPECT_EQ(tokenizer->encode("abc"), (std::vector<TokenId>{2}));
}

// A byte-level BPE vocabulary with the given extra tokens (ids from 1; id 0 is "a").
Vocab bpe_vocab(const std::vector<std::pair<std::string, TokenType>>& extra) {
  Vocab vocab;
  vocab.kind = VocabKind::kBpe;
  vocab.pre = "gpt-2";
  vocab.add_space_prefix = false;
  vocab.tokens = {"a"};
  vocab.types = {TokenType::kNormal};
  for (const auto& [text, type] : extra) {
    vocab.tokens.push_back(text);
    vocab.types.push_back(type);
  }
  return vocab;
}

TEST(EndOfGeneration, ControlTokensNamedLikeAnEndOfTurn) {
  auto tokenizer = Tokenizer::create(bpe_vocab({{"<|im_end|>", TokenType::kControl},
                                                {"<|eot_id|>", TokenType::kNormal},
                                                {"<|im_start|>", TokenType::kControl}}));
  EXPECT_TRUE(tokenizer->is_eog(1));
  EXPECT_FALSE(tokenizer->is_eog(2));  // not a control token
  EXPECT_FALSE(tokenizer->is_eog(3));
  EXPECT_FALSE(tokenizer->is_eog(0));
  EXPECT_FALSE(tokenizer->is_eog(-1));

  Vocab with_eos = bpe_vocab({{"</s>", TokenType::kNormal}});
  with_eos.eos = 1;
  EXPECT_TRUE(Tokenizer::create(with_eos)->is_eog(1));
}

// gpt-oss: <|end|> closes a message, <|return|> / <|call|> end the turn.
TEST(EndOfGeneration, HarmonyEndIsNotEndOfGeneration) {
  auto tokenizer = Tokenizer::create(bpe_vocab({{"<|end|>", TokenType::kControl},
                                                {"<|return|>", TokenType::kControl},
                                                {"<|call|>", TokenType::kControl}}));
  EXPECT_FALSE(tokenizer->is_eog(1));
  EXPECT_TRUE(tokenizer->is_eog(2));
  EXPECT_TRUE(tokenizer->is_eog(3));
  EXPECT_EQ(tokenizer->eog_ids().size(), 2u);
  EXPECT_TRUE(Tokenizer::create(bpe_vocab({{"<|end|>", TokenType::kControl}}))->is_eog(1));
}

TEST(Validate, Invariants) {
  Vocab vocab;
  vocab.tokens = {"a", "b"};
  vocab.types = {TokenType::kNormal, TokenType::kNormal};
  EXPECT_NO_THROW(validate(vocab));
  expect_error([] { validate(Vocab{}); }, "no tokens");
  {
    Vocab bad = vocab;
    bad.types.pop_back();
    expect_error([&] { validate(bad); }, "token types");
  }
  {
    Vocab bad = vocab;
    bad.scores = {0.0f, std::nanf("")};
    expect_error([&] { validate(bad); }, "NaN");
  }
  {
    Vocab bad = vocab;
    bad.eos = 2;
    expect_error([&] { validate(bad); }, "eos");
  }
  {
    Vocab bad = vocab;
    bad.add_bos = true;
    expect_error([&] { validate(bad); }, "BOS");
  }
}

}  // namespace
}  // namespace sieve::tok
