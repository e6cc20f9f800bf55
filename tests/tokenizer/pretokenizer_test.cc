// Pre-tokenizer splits per family, derived by hand from the regex lists (see pretokenizer.cc).
// The gpt-2 and deepseek-llm families are also covered end to end by the golden vectors.
#include "tokenizer/pretokenizer.h"

#include <gtest/gtest.h>

#include "util/error.h"

namespace sieve::tok {
namespace {

using Words = std::vector<std::string>;

Words split(std::string_view family, std::string_view text) {
  return PreTokenizer(family).split(text);
}

TEST(PreTokenizer, Gpt2) {
  EXPECT_EQ(split("gpt-2", "Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(split("gpt-2", "Hello  world"), (Words{"Hello", " ", " world"}));
  EXPECT_EQ(split("gpt-2", "I'm here's"), (Words{"I", "'m", " here", "'s"}));
  EXPECT_EQ(split("gpt-2", "it's 2024!!"), (Words{"it", "'s", " 2024", "!!"}));
  EXPECT_EQ(split("gpt-2", "a   \n"), (Words{"a", "   \n"}));
  EXPECT_EQ(split("gpt-2", "'S"), (Words{"'", "S"}));  // contractions are lower case only
  EXPECT_EQ(split("gpt-2", ""), Words{});
}

TEST(PreTokenizer, MptAndOlmoAreGpt2) {
  EXPECT_EQ(split("mpt", "it's 2024!!"), (Words{"it", "'s", " 2024", "!!"}));
  EXPECT_EQ(split("olmo", "Hello  world"), (Words{"Hello", " ", " world"}));
}

TEST(PreTokenizer, Llama3) {
  EXPECT_EQ(split("llama-bpe", "12345"), (Words{"123", "45"}));
  EXPECT_EQ(split("llama-bpe", "I'M"), (Words{"I", "'M"}));
  EXPECT_EQ(split("llama-bpe", "they'RE"), (Words{"they", "'RE"}));
  EXPECT_EQ(split("llama-bpe", "Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(split("llama-bpe", "a\n\nb"), (Words{"a", "\n\n", "b"}));
  EXPECT_EQ(split("llama-bpe", "  x"), (Words{" ", " x"}));
  EXPECT_EQ(split("llama-bpe", "x!!!\n\ny"), (Words{"x", "!!!\n\n", "y"}));
  EXPECT_EQ(split("llama-bpe", "$100"), (Words{"$", "100"}));
  EXPECT_EQ(split("llama3", "ÄPFEL 1234567"), (Words{"ÄPFEL", " ", "123", "456", "7"}));
  ASSERT_TRUE(find_pre_tokenizer("llama-bpe"));
  EXPECT_TRUE(find_pre_tokenizer("llama-bpe")->ignore_merges);
  EXPECT_TRUE(find_pre_tokenizer("llama-bpe")->add_bos);
}

TEST(PreTokenizer, Qwen2SplitsEveryDigit) {
  EXPECT_EQ(split("qwen2", "12345"), (Words{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(split("qwen2", "Hello, world"), (Words{"Hello", ",", " world"}));
  EXPECT_EQ(split("qwen2", "I'M"), (Words{"I", "'M"}));
}

TEST(PreTokenizer, DeepseekCoder) {
  EXPECT_EQ(split("deepseek-coder", "abc123 def"), (Words{"abc", "1", "2", "3", " def"}));
  EXPECT_EQ(split("deepseek-coder", "a\nb"), (Words{"a", "\n", "b"}));
  EXPECT_EQ(split("deepseek-coder", "x, 你好"), (Words{"x", ",", " ", "你好"}));
}

TEST(PreTokenizer, DeepseekLlm) {
  EXPECT_EQ(split("deepseek-llm", "Hello 123!\n"), (Words{"Hello", " ", "123", "!", "\n"}));
  // The trailing-whitespace rule (\s+$) only takes whitespace at the very end of a piece.
  EXPECT_EQ(split("deepseek-llm", "1  2  "), (Words{"1", "  ", "2", "  "}));
}

TEST(PreTokenizer, Falcon) {
  EXPECT_EQ(split("falcon", "Hello, world! 12345"),
            (Words{"Hello", ",", " world", "!", " ", "123", "45"}));
}

TEST(PreTokenizer, StarcoderAndRefactSplitDigitsFirst) {
  EXPECT_EQ(split("starcoder", "abc 123"), (Words{"abc", " ", "1", "2", "3"}));
  EXPECT_EQ(split("refact", "abc 123"), (Words{"abc", " ", "1", "2", "3"}));
  EXPECT_EQ(split("command-r", "x12"), (Words{"x", "1", "2"}));
}

TEST(PreTokenizer, Default) {
  EXPECT_EQ(split("default", "Hello, world"), (Words{"Hello", ",", " world"}));
  EXPECT_EQ(split("default", "a+b=1234"), (Words{"a", "+", "b", "=", "123", "4"}));
}

TEST(PreTokenizer, Gpt4oAndTekken) {
  EXPECT_EQ(split("gpt-4o", "HelloWorld"), (Words{"Hello", "World"}));
  EXPECT_EQ(split("gpt-4o", "I'm"), (Words{"I'm"}));
  EXPECT_EQ(split("gpt-4o", "123456"), (Words{"123", "456"}));
  EXPECT_EQ(split("tekken", "12"), (Words{"1", "2"}));
  EXPECT_EQ(split("tekken", "HelloWorld"), (Words{"Hello", "World"}));
}

TEST(PreTokenizer, BloomKeepsSentenceMarksApart) {
  EXPECT_EQ(split("bloom", "Hello, world."), (Words{"Hello", ",", " world", "."}));
}

// Whitespace is Unicode White_Space: NBSP is, U+180E (MONGOLIAN VOWEL SEPARATOR) is not, even
// though PCRE2's own \s takes it.
TEST(PreTokenizer, WhitespaceIsUnicodeWhiteSpace) {
  EXPECT_EQ(split("gpt-2", "x\u00A0\u00A0y"), (Words{"x", "\u00A0", "\u00A0", "y"}));
  EXPECT_EQ(split("gpt-2", "x\u180E\u180Ey"), (Words{"x", "\u180E\u180E", "y"}));
}

TEST(PreTokenizer, MalformedUtf8BecomesReplacementCharacters) {
  EXPECT_EQ(split("gpt-2",
                  "a\xFF"
                  "b"),
            (Words{"a", "\uFFFD", "b"}));
  EXPECT_EQ(split("gpt-2", "\xC3"), (Words{"\uFFFD"}));
  // A surrogate (invalid, but llama.cpp's decoder lets it through) stays one symbol.
  EXPECT_EQ(split("gpt-2",
                  "a\xED\xA0\x80"
                  "b"),
            (Words{"a", "\xED\xA0\x80", "b"}));
}

TEST(PreTokenizer, WordsConcatenateToTheText) {
  const std::string text = "Hello, y'all! 12345 \t\n  你好 ÄÖÜ …!!\r\n";
  for (std::string_view family :
       {"default", "gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "deepseek-v3",
        "falcon", "starcoder", "refact", "mpt", "command-r", "gpt-4o", "tekken", "bloom", "viking",
        "seed-coder", "bailingmoe", "qwen35"}) {
    std::string joined;
    for (const auto& word : split(family, text)) {
      EXPECT_FALSE(word.empty()) << family;
      joined += word;
    }
    EXPECT_EQ(joined, text) << family;
  }
}

// A 200 000-letter word through the families whose regexes repeat groups (JIT stack).
TEST(PreTokenizer, LongWord) {
  const std::string word(200000, 'a');
  for (std::string_view family : {"gpt-4o", "tekken", "llama-bpe", "deepseek-llm"}) {
    EXPECT_EQ(split(family, word), Words{word}) << family;
  }
}

TEST(PreTokenizer, UnknownFamilyThrows) {
  EXPECT_THROW(PreTokenizer("no-such-pre"), Error);
  EXPECT_FALSE(find_pre_tokenizer("no-such-pre"));
}

}  // namespace
}  // namespace sieve::tok
