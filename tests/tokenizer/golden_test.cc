// End-to-end tokenizer tests on the shared llama.cpp reference vocabularies and on
// stories260K: golden ids, round trips, special tokens, BOS/EOS, long inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "test_util.h"

namespace sieve::tok {
namespace {

using testing::escaped;
using testing::golden_tokenizer;
using testing::read_golden_cases;

constexpr EncodeOptions kPlain{.add_special = false, .parse_special = false};

class GoldenTest : public ::testing::TestWithParam<std::string> {};

// The ids llama.cpp produces (add_special = false, parse_special = false), case by case.
TEST_P(GoldenTest, MatchesLlamaCppIds) {
  const Tokenizer& tokenizer = golden_tokenizer(GetParam());
  const auto cases = read_golden_cases(GetParam());
  ASSERT_EQ(cases.size(), 46u);
  size_t passed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto ids = tokenizer.encode(cases[i].text, kPlain);
    EXPECT_EQ(ids, cases[i].ids) << "case " << i << ": \"" << escaped(cases[i].text) << "\"";
    passed += ids == cases[i].ids;
  }
  std::printf("[ golden   ] %s: %zu/%zu cases match llama.cpp\n", GetParam().c_str(), passed,
              cases.size());
}

// decode(encode(x)) == x, with and without BOS/EOS; SPM drops the space encode() prepends.
TEST_P(GoldenTest, DecodeInvertsEncode) {
  const Tokenizer& tokenizer = golden_tokenizer(GetParam());
  for (const auto& c : read_golden_cases(GetParam())) {
    for (bool add_special : {false, true}) {
      const auto ids = tokenizer.encode(c.text, {.add_special = add_special});
      EXPECT_EQ(tokenizer.decode(ids), c.text)
          << "add_special=" << add_special << " \"" << escaped(c.text) << "\"";
    }
  }
}

// Every piece of the golden encodings concatenates to the decoded text.
TEST_P(GoldenTest, PiecesConcatenateToDecode) {
  const Tokenizer& tokenizer = golden_tokenizer(GetParam());
  for (const auto& c : read_golden_cases(GetParam())) {
    std::string joined;
    for (TokenId id : c.ids) joined += tokenizer.token_to_piece(id);
    std::string decoded = tokenizer.decode(c.ids);
    if (tokenizer.vocab().kind == VocabKind::kSpm && !joined.empty() && joined[0] == ' ') {
      joined.erase(0, 1);
    }
    EXPECT_EQ(joined, decoded);
  }
}

// 80 KB of mixed text round-trips. (How fast, and that long inputs are not quadratic, is
// measured by bench/tokenizer_bench, not asserted here: wall-clock bounds fail on loaded machines.)
TEST_P(GoldenTest, LongTextRoundTrips) {
  const Tokenizer& tokenizer = golden_tokenizer(GetParam());
  std::string text;
  const auto cases = read_golden_cases(GetParam());
  while (text.size() < 80 * 1024) {
    for (const auto& c : cases) text += c.text + "\n";
  }
  const auto ids = tokenizer.encode(text, kPlain);
  EXPECT_GT(ids.size(), text.size() / 16);
  EXPECT_EQ(tokenizer.decode(ids), text);
}

// One long word (no pre-tokenizer cut, SPM: one fragment) and long runs of whitespace round-trip.
TEST_P(GoldenTest, LongWordsAndRunsRoundTrip) {
  const Tokenizer& tokenizer = golden_tokenizer(GetParam());
  for (const std::string& text :
       {std::string(60000, 'a'), std::string(60000, ' ') + "1", std::string(30000, '\n'),
        std::string(20000, ' ') + std::string(20000, '\t') + "x"}) {
    const auto ids = tokenizer.encode(text, kPlain);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(tokenizer.decode(ids), text) << text.size() << " bytes";
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabs, GoldenTest,
                         ::testing::Values("llama-spm", "gpt-2", "deepseek-llm"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

// ---------------------------------------------------------------------------------------------
// Special tokens

TEST(SpecialTokens, Gpt2EndOfTextIsOneIdOnlyWithParseSpecial) {
  const Tokenizer& tokenizer = golden_tokenizer("gpt-2");
  EXPECT_EQ(tokenizer.encode("<|endoftext|>", {.add_special = false, .parse_special = true}),
            std::vector<TokenId>{50256});
  const auto plain = tokenizer.encode("<|endoftext|>", kPlain);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0);

  const auto ids =
      tokenizer.encode("Hello<|endoftext|> world", {.add_special = false, .parse_special = true});
  EXPECT_EQ(ids, (std::vector<TokenId>{15496, 50256, 995}));
  EXPECT_EQ(tokenizer.decode(ids), "Hello world");
  EXPECT_EQ(tokenizer.decode(ids, /*render_special=*/true), "Hello<|endoftext|> world");
  EXPECT_EQ(tokenizer.token_to_piece(50256), "");
  EXPECT_EQ(tokenizer.token_to_piece(50256, true), "<|endoftext|>");
}

TEST(SpecialTokens, DeepseekBeginOfSentence) {
  const Tokenizer& tokenizer = golden_tokenizer("deepseek-llm");
  const std::string bos = "<｜begin▁of▁sentence｜>";
  EXPECT_EQ(tokenizer.encode(bos, {.add_special = false, .parse_special = true}),
            std::vector<TokenId>{100000});
  const auto with_text =
      tokenizer.encode(bos + "Hello", {.add_special = false, .parse_special = true});
  ASSERT_GE(with_text.size(), 2u);
  EXPECT_EQ(with_text[0], 100000);
  EXPECT_EQ(std::vector<TokenId>(with_text.begin() + 1, with_text.end()),
            tokenizer.encode("Hello", kPlain));
  const auto plain = tokenizer.encode(bos, kPlain);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 100000), 0);
  EXPECT_EQ(tokenizer.decode(plain), bos);
}

// USER_DEFINED tokens are cut out even without parse_special (deepseek's "ü" is one).
TEST(SpecialTokens, UserDefinedTokensAlwaysMatch) {
  const Tokenizer& tokenizer = golden_tokenizer("deepseek-llm");
  EXPECT_EQ(tokenizer.vocab().types[100014], TokenType::kUserDefined);
  EXPECT_EQ(tokenizer.encode("ü", kPlain), std::vector<TokenId>{100014});
  EXPECT_EQ(tokenizer.token_to_piece(100014), "ü");
}

TEST(SpecialTokens, SpmControlTokensAndSpacePrefix) {
  const Tokenizer& tokenizer = golden_tokenizer("llama-spm");
  // After a special token the next text fragment gets its own space prefix, as in llama.cpp.
  const auto ids = tokenizer.encode("<s>Hello</s>", {.add_special = false, .parse_special = true});
  EXPECT_EQ(ids, (std::vector<TokenId>{1, 15043, 2}));
  const auto plain = tokenizer.encode("<s>", kPlain);
  EXPECT_NE(plain, std::vector<TokenId>{1});
  EXPECT_EQ(tokenizer.decode(plain), "<s>");
}

TEST(SpecialTokens, EndOfGeneration) {
  EXPECT_TRUE(golden_tokenizer("gpt-2").is_eog(50256));
  EXPECT_FALSE(golden_tokenizer("gpt-2").is_eog(15496));
  EXPECT_TRUE(golden_tokenizer("deepseek-llm").is_eog(100001));
  EXPECT_FALSE(golden_tokenizer("deepseek-llm").is_eog(100000));
  EXPECT_TRUE(golden_tokenizer("llama-spm").is_eog(2));
  EXPECT_FALSE(golden_tokenizer("llama-spm").is_eog(1));
  EXPECT_TRUE(golden_tokenizer("llama-spm").is_control(1));
  EXPECT_FALSE(golden_tokenizer("llama-spm").is_control(15043));
  EXPECT_FALSE(golden_tokenizer("llama-spm").is_control(-1));
}

// ---------------------------------------------------------------------------------------------
// BOS / EOS

TEST(Bos, AddedWhenTheVocabularySaysSo) {
  const Tokenizer& spm = golden_tokenizer("llama-spm");
  EXPECT_EQ(spm.encode("Hello world"), (std::vector<TokenId>{1, 15043, 3186}));
  EXPECT_EQ(spm.encode(""), std::vector<TokenId>{1});
  EXPECT_EQ(spm.encode("", kPlain), std::vector<TokenId>{});
  EXPECT_EQ(spm.decode(std::vector<TokenId>{1, 15043, 3186}), "Hello world");
  EXPECT_EQ(spm.decode(std::vector<TokenId>{1, 15043, 3186}, true), "<s>Hello world");

  const Tokenizer& deepseek = golden_tokenizer("deepseek-llm");
  const auto ids = deepseek.encode("Hello");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 100000);
  EXPECT_NE(ids.back(), 100001);  // add_eos_token = false

  const Tokenizer& gpt2 = golden_tokenizer("gpt-2");  // no add_bos_token key: no BOS
  EXPECT_EQ(gpt2.encode("Hello"), std::vector<TokenId>{15496});
}

TEST(Bos, OutOfRangeIdsThrow) {
  const Tokenizer& spm = golden_tokenizer("llama-spm");
  EXPECT_THROW(spm.decode(std::vector<TokenId>{32000}), Error);
  EXPECT_THROW(spm.token_to_piece(-1), Error);
}

// ---------------------------------------------------------------------------------------------
// stories260K (the tiny model's 512-token SentencePiece vocabulary)

TEST(Stories260K, OnceUponATime) {
  auto tokenizer = Tokenizer::create(
      testing::load_gguf_vocab(sieve::testing::shared_path("models/stories260K.gguf")));
  const auto ids = tokenizer->encode("Once upon a time");
  EXPECT_EQ(ids, (std::vector<TokenId>{1, 403, 407, 261, 378}));
  EXPECT_EQ(tokenizer->decode(ids), "Once upon a time");
  EXPECT_TRUE(tokenizer->is_eog(2));
  // Characters outside the 512 pieces fall back to byte tokens (<0xXX> = id 3 + byte).
  const auto emoji = tokenizer->encode("😀", kPlain);  // "▁😀": "▁" (410), F0 9F 98 80
  EXPECT_EQ(emoji, (std::vector<TokenId>{410, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80}));
  EXPECT_EQ(tokenizer->decode(emoji), "😀");
}

// FastGen's token classes on the real vocabulary. Punctuation is Unicode's P category: the
// ASCII ones below, curly quotes, dashes and the ellipsis; not symbols ($ + < > | ~ ` € ™), not
// white space (the no-break and hair spaces), not letters.
TEST(Stories260K, SpecialAndPunctuationTokens) {
  auto tokenizer = Tokenizer::create(
      testing::load_gguf_vocab(sieve::testing::shared_path("models/stories260K.gguf")));
  const std::string ascii_punctuation = "!\"#%&'()*,-./:;?@[\\]_{}";
  const std::set<std::string> punctuation_pieces = {
      " \"",    ".", ",",      "\"", "'",      "!",      "?",      "-",      "\u201C",
      "\u201D", ":", "\u2019", ";",  "\u2013", "\u2014", "\u2018", "\u2026", ")",
      "(",      "/", "*",      "&",  "\\",     "%",      "[",      "]"};
  const Vocab& vocab = tokenizer->vocab();
  size_t num_punctuation = 0, num_special = 0;
  for (TokenId id = 0; id < static_cast<TokenId>(vocab.size()); ++id) {
    const std::string piece = tokenizer->token_to_piece(id);
    bool want;
    if (vocab.types[id] == TokenType::kByte) {
      want = piece.size() == 1 && ascii_punctuation.find(piece[0]) != std::string::npos;
    } else {
      want = vocab.types[id] == TokenType::kNormal && punctuation_pieces.count(piece) > 0;
    }
    EXPECT_EQ(tokenizer->is_punctuation(id), want) << id << " \"" << escaped(piece) << "\"";
    num_punctuation += tokenizer->is_punctuation(id);
    EXPECT_EQ(tokenizer->is_special(id), id == 1 || id == 2) << id;  // <s>, </s>; <unk> is not
    num_special += tokenizer->is_special(id);
  }
  EXPECT_EQ(num_punctuation, punctuation_pieces.size() + ascii_punctuation.size());
  EXPECT_EQ(num_special, 2u);
  EXPECT_FALSE(tokenizer->is_punctuation(-1));
  EXPECT_FALSE(tokenizer->is_special(512));

  // In a prompt: BOS special, then the tokens of ", : \" ! \"" punctuation and nothing else.
  const auto ids = tokenizer->encode("Once upon a time, Lily said: \"Hi!\"");
  std::string classes;
  for (TokenId id : ids) {
    classes += tokenizer->is_special(id) ? 'S' : tokenizer->is_punctuation(id) ? 'P' : '-';
  }
  std::string want_classes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string piece = tokenizer->token_to_piece(ids[i]);
    want_classes += i == 0                                                   ? 'S'
                    : piece.find_first_not_of(" ,:\"!") == std::string::npos ? 'P'
                                                                             : '-';
  }
  EXPECT_EQ(classes, want_classes);
  EXPECT_EQ(std::count(classes.begin(), classes.end(), 'P'), 5);  // , : " ! "
}

}  // namespace
}  // namespace sieve::tok
