// llama2.c tokenizer files (tok512.bin) against the GGUF conversion of the same vocabulary.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "test_util.h"
#include "util/error.h"

namespace sieve::tok {
namespace {

constexpr size_t kStoriesVocabSize = 512;

Vocab gguf_vocab() {
  return testing::load_gguf_vocab(sieve::testing::shared_path("models/stories260K.gguf"));
}
Vocab llama2c_vocab() {
  return load_llama2c_vocab(sieve::testing::shared_path("models/tok512.bin"), kStoriesVocabSize);
}

TEST(Llama2cVocab, SameVocabularyAsTheGgufConversion) {
  const Vocab from_bin = llama2c_vocab();
  const Vocab from_gguf = gguf_vocab();
  ASSERT_EQ(from_bin.size(), kStoriesVocabSize);
  EXPECT_EQ(from_bin.tokens, from_gguf.tokens);
  EXPECT_EQ(from_bin.scores, from_gguf.scores);
  EXPECT_EQ(from_bin.types, from_gguf.types);
  EXPECT_TRUE(from_bin == from_gguf);
  EXPECT_EQ(from_bin.tokens[1], "<s>");
  EXPECT_EQ(from_bin.types[3], TokenType::kByte);
  EXPECT_EQ(from_bin.tokens[3 + 0x0A], "<0x0A>");
}

TEST(Llama2cVocab, SameEncodingsAndPieces) {
  auto from_bin = Tokenizer::create(llama2c_vocab());
  auto from_gguf = Tokenizer::create(gguf_vocab());
  std::vector<std::string> texts = {"Once upon a time",
                                    "",
                                    " ",
                                    "  leading spaces",
                                    "trailing  ",
                                    "Lily and Ben went to "
                                    "the park.\nThey saw a big dog!",
                                    "Ünïcödé ✓ 你好 😀",
                                    "tabs\tand\r\nnewlines",
                                    "<s>not special</s>",
                                    "\xFF\xFE broken utf-8 \xC3"};
  for (const auto& c : testing::read_golden_cases("llama-spm")) texts.push_back(c.text);
  for (const std::string& text : texts) {
    for (bool add_special : {false, true}) {
      const EncodeOptions options{.add_special = add_special, .parse_special = true};
      const auto ids = from_bin->encode(text, options);
      EXPECT_EQ(ids, from_gguf->encode(text, options)) << testing::escaped(text);
    }
  }
  for (TokenId id = 0; id < static_cast<TokenId>(kStoriesVocabSize); ++id) {
    EXPECT_EQ(from_bin->token_to_piece(id, true), from_gguf->token_to_piece(id, true)) << id;
    EXPECT_EQ(from_bin->token_to_piece(id), from_gguf->token_to_piece(id)) << id;
  }
  EXPECT_EQ(from_bin->token_to_piece(3 + ' '), " ");
  EXPECT_EQ(from_bin->token_to_piece(1), "");
}

class MalformedLlama2c : public ::testing::Test {
 protected:
  std::string write(const std::string& bytes) {
    const std::string path =
        (std::filesystem::path(::testing::TempDir()) /
         (std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + ".bin"))
            .string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  static std::string i32(int32_t v) { return std::string(reinterpret_cast<char*>(&v), 4); }
  static std::string f32(float v) { return std::string(reinterpret_cast<char*>(&v), 4); }
  static std::string token(const std::string& text, float score = 0) {
    return f32(score) + i32(static_cast<int32_t>(text.size())) + text;
  }
  template <typename Fn>
  void expect_error(Fn&& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
};

TEST_F(MalformedLlama2c, Errors) {
  const std::string good = i32(4) + token("<unk>") + token("\n<s>\n") + token("\n</s>\n") +
                           token(" a", -1) + token("a", -2);
  EXPECT_EQ(load_llama2c_vocab(write(good), 5).tokens[3], "\u2581a");
  expect_error([&] { load_llama2c_vocab(write(good), 6); }, "truncated");
  expect_error([&] { load_llama2c_vocab(write(good.substr(0, good.size() - 1)), 5); }, "truncated");
  expect_error([&] { load_llama2c_vocab(write(""), 5); }, "max_token_length");
  expect_error([&] { load_llama2c_vocab(write(i32(-1)), 5); }, "max_token_length");
  expect_error([&] { load_llama2c_vocab(write(i32(4) + f32(0) + i32(-5)), 5); }, "negative");
  expect_error([&] { load_llama2c_vocab(write(i32(4) + f32(0) + i32(1 << 30)), 5); }, "truncated");
  expect_error([&] { load_llama2c_vocab(write(good), 2); }, "out of range");
  expect_error(
      [&] {
        load_llama2c_vocab(
            write(i32(4) + token("a") + token("b") + token("c") + token("x") + token("x")), 5);
      },
      "duplicate");
  expect_error([&] { load_llama2c_vocab("/nonexistent/tok.bin", 5); }, "/nonexistent/tok.bin");
}

}  // namespace
}  // namespace sieve::tok
