#include "engine/stop_matcher.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sieve::engine {
namespace {

constexpr TokenId kText = 100;  // an ordinary token
constexpr TokenId kEos = 2;
const std::vector<TokenId> kEosIds = {kEos};

// Pushes each piece as an ordinary token; returns what was emitted after each push, and the
// matcher for inspection of the end state.
struct Pushed {
  std::vector<std::string> emitted;
  std::string all;
  std::optional<Finish> finish;
};
Pushed push_all(StopMatcher& matcher, const std::vector<std::string>& pieces) {
  Pushed run;
  for (const std::string& piece : pieces) {
    StopUpdate update = matcher.push(kText, piece);
    run.emitted.push_back(update.text);
    run.all += update.text;
    if (update.finish) {
      run.finish = update.finish;
      break;
    }
  }
  return run;
}

std::string matched_string(const std::optional<Finish>& finish) {
  if (!finish || !std::holds_alternative<std::string>(finish->matched)) return "<none>";
  return std::get<std::string>(finish->matched);
}

TEST(StopMatcher, StopStringAcrossTokenBoundaries) {
  StopMatcher matcher({.stop_strings = {"lo w"}}, kEosIds);
  Pushed run = push_all(matcher, {"Hel", "lo wor", "ld"});
  EXPECT_EQ(run.emitted, (std::vector<std::string>{"He", "l"}));  // "l" held, then released
  EXPECT_EQ(run.all, "Hel");
  ASSERT_TRUE(run.finish);
  EXPECT_EQ(run.finish->reason, FinishReason::kStop);
  EXPECT_EQ(matched_string(run.finish), "lo w");
  EXPECT_TRUE(matcher.finished());
  EXPECT_EQ(matcher.num_tokens(), 2);
}

TEST(StopMatcher, IncludeStopStringInOutputHoldsNothingBack) {
  StopMatcher matcher({.stop_strings = {"lo w"}, .include_stop_str_in_output = true}, kEosIds);
  Pushed run = push_all(matcher, {"Hel", "lo wor", "ld"});
  EXPECT_EQ(run.emitted, (std::vector<std::string>{"Hel", "lo w"}));
  EXPECT_EQ(matched_string(run.finish), "lo w");
}

TEST(StopMatcher, OverlappingPrefixes) {
  // "aab": every "a" could start it; only the bytes that can no longer do so are released.
  StopMatcher matcher({.stop_strings = {"aab"}}, kEosIds);
  Pushed run = push_all(matcher, {"a", "a", "a", "a", "b", "z"});
  EXPECT_EQ(run.emitted, (std::vector<std::string>{"", "", "a", "a", ""}));
  EXPECT_EQ(run.all, "aa");
  EXPECT_EQ(matched_string(run.finish), "aab");

  // A self-overlapping stop string: "abab" in "abaabab" starts at 3.
  StopMatcher kmp({.stop_strings = {"abab"}}, kEosIds);
  run = push_all(kmp, {"ab", "aab", "ab", "x"});
  EXPECT_EQ(run.all, "aba");
  // "ab" could start it; after "abaab" only the final "ab" still could.
  EXPECT_EQ(run.emitted, (std::vector<std::string>{"", "aba", ""}));
}

TEST(StopMatcher, MultipleStopStringsFirstToCompleteWins) {
  {
    StopMatcher matcher({.stop_strings = {"world", "lo"}}, kEosIds);
    Pushed run = push_all(matcher, {"Hello world"});
    EXPECT_EQ(run.all, "Hel");
    EXPECT_EQ(matched_string(run.finish), "lo");
  }
  {  // "b" completes before "abc", though "abc" starts first and is listed first.
    StopMatcher matcher({.stop_strings = {"abc", "b"}}, kEosIds);
    Pushed run = push_all(matcher, {"xabc"});
    EXPECT_EQ(run.all, "xa");
    EXPECT_EQ(matched_string(run.finish), "b");
  }
  {  // Both complete on the same byte: the one starting first wins.
    StopMatcher matcher({.stop_strings = {"bc", "abc"}}, kEosIds);
    Pushed run = push_all(matcher, {"xa", "bc"});
    EXPECT_EQ(run.all, "x");
    EXPECT_EQ(matched_string(run.finish), "abc");
  }
}

TEST(StopMatcher, StopStringAtTheVeryStart) {
  StopMatcher matcher({.stop_strings = {"Hel"}}, kEosIds);
  Pushed run = push_all(matcher, {"Hello"});
  EXPECT_EQ(run.all, "");
  EXPECT_EQ(matched_string(run.finish), "Hel");
}

TEST(StopMatcher, HeldBackTextIsFlushedAtFinish) {
  {  // max_tokens reached with a possible stop prefix held back.
    StopMatcher matcher({.max_tokens = 2, .stop_strings = {"xyz"}}, kEosIds);
    StopUpdate first = matcher.push(kText, "abcx");
    EXPECT_EQ(first.text, "abc");
    EXPECT_FALSE(first.finish);
    StopUpdate second = matcher.push(kText, "y");
    EXPECT_EQ(second.text, "xy");
    ASSERT_TRUE(second.finish);
    EXPECT_EQ(second.finish->reason, FinishReason::kLength);
    EXPECT_TRUE(std::holds_alternative<std::monostate>(second.finish->matched));
  }
  {  // Finished from outside (context full).
    StopMatcher matcher({.stop_strings = {"xyz"}}, kEosIds);
    EXPECT_EQ(matcher.push(kText, "abxy").text, "ab");
    StopUpdate last = matcher.finish(FinishReason::kLength);
    EXPECT_EQ(last.text, "xy");
    EXPECT_EQ(last.finish->reason, FinishReason::kLength);
  }
  {  // EOS: held text is released, the EOS piece is not.
    StopMatcher matcher({.stop_strings = {"xyz"}}, kEosIds);
    EXPECT_EQ(matcher.push(kText, "abx").text, "ab");
    StopUpdate last = matcher.push(kEos, "</s>");
    EXPECT_EQ(last.text, "x");
    ASSERT_TRUE(last.finish);
    EXPECT_EQ(last.finish->reason, FinishReason::kStop);
    EXPECT_TRUE(std::holds_alternative<std::monostate>(last.finish->matched));
  }
}

TEST(StopMatcher, StopTokenIds) {
  {
    StopMatcher matcher({.stop_token_ids = {7}}, kEosIds);
    EXPECT_EQ(matcher.push(kText, "hi").text, "hi");
    StopUpdate last = matcher.push(7, "<|eot|>");
    EXPECT_EQ(last.text, "");
    ASSERT_TRUE(last.finish);
    EXPECT_EQ(std::get<TokenId>(last.finish->matched), 7);
  }
  {
    StopMatcher matcher({.stop_token_ids = {7}, .include_stop_str_in_output = true}, kEosIds);
    EXPECT_EQ(matcher.push(7, "<|eot|>").text, "<|eot|>");
  }
  {  // ignore_eos: EOS is ordinary text; stop ids still stop.
    StopMatcher matcher({.stop_token_ids = {7}, .ignore_eos = true}, kEosIds);
    StopUpdate eos = matcher.push(kEos, "</s>");
    EXPECT_EQ(eos.text, "</s>");
    EXPECT_FALSE(eos.finish);
    EXPECT_TRUE(matcher.push(7, "").finish);
  }
  {  // A stop on the max_tokens-th token is "stop".
    StopMatcher matcher({.max_tokens = 1}, kEosIds);
    EXPECT_EQ(matcher.push(kEos, "").finish->reason, FinishReason::kStop);
  }
  EXPECT_EQ(finish_reason_name(FinishReason::kStop), "stop");
  EXPECT_EQ(finish_reason_name(FinishReason::kLength), "length");
}

TEST(StopMatcher, MinTokensDefersStops) {
  {  // Stop ids and EOS are text before the min_tokens-th token.
    StopMatcher matcher({.min_tokens = 2}, kEosIds);
    StopUpdate early = matcher.push(kEos, "e");
    EXPECT_FALSE(early.finish);
    EXPECT_EQ(early.text, "e");
    EXPECT_TRUE(matcher.push(kEos, "e").finish);
  }
  {  // A stop string must end in the text of token min_tokens or later.
    StopMatcher matcher({.min_tokens = 3, .stop_strings = {"ab"}}, kEosIds);
    Pushed run = push_all(matcher, {"ab", "xa", "b!"});
    EXPECT_EQ(run.all, "abx");  // the first "ab" ended in token 1; the second ends in token 3
    EXPECT_EQ(matched_string(run.finish), "ab");
  }
}

TEST(StopMatcher, Utf8NeverSplitsACharacter) {
  {  // "é" is C3 A9.
    StopMatcher matcher(SamplingParams{}, kEosIds);
    EXPECT_EQ(matcher.push(kText, "caf\xC3").text, "caf");
    EXPECT_EQ(matcher.push(kText, "\xA9!").text, "\xC3\xA9!");
  }
  {  // A stop string whose characters arrive byte by byte across tokens: "日本" = E6 97 A5 E6 9C
     // AC.
    StopMatcher matcher({.stop_strings = {"\xE6\x97\xA5\xE6\x9C\xAC"}}, kEosIds);
    Pushed run = push_all(matcher, {"x\xE6", "\x97", "\xA5\xE6\x9C", "\xAC y"});
    EXPECT_EQ(run.emitted, (std::vector<std::string>{"x", "", "", ""}));
    EXPECT_EQ(matched_string(run.finish), "\xE6\x97\xA5\xE6\x9C\xAC");
  }
  {  // Held back as a possible stop prefix, then released as a whole character.
    StopMatcher matcher({.stop_strings = {"\xC3\xA9"
                                          "a"}},
                        kEosIds);
    Pushed run = push_all(matcher, {"\xC3", "\xA9", "e"});
    EXPECT_EQ(run.emitted, (std::vector<std::string>{"", "",
                                                     "\xC3\xA9"
                                                     "e"}));
    EXPECT_FALSE(run.finish);
  }
}

// The output must not depend on how the text is cut into tokens, and after each push exactly the
// text that cannot start a stop string must have been emitted.
std::string reference_output(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t best = std::string::npos;
    for (const std::string& stop : stops) {
      if (stop.size() <= end && text.compare(end - stop.size(), stop.size(), stop) == 0) {
        best = std::min(best, end - stop.size());
      }
    }
    if (best != std::string::npos) return text.substr(0, best);
  }
  return text;
}
size_t reference_safe(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t i = 0; i < text.size(); ++i) {
    for (const std::string& stop : stops) {
      const size_t len = text.size() - i;
      if (len < stop.size() && stop.compare(0, len, text, i, len) == 0) return i;
    }
  }
  return text.size();
}

TEST(StopMatcher, AnySplitGivesTheSameOutput) {
  const std::vector<std::string> texts = {"abcabdabcx", "aaabaaab", "the end. The End", "xyxyxyz"};
  const std::vector<std::vector<std::string>> stop_sets = {
      {"abd"}, {"ab", "bca"}, {"aab", "b"}, {"End", "end."}, {"xyz", "yxy"}, {"zz"}};
  for (const std::string& text : texts) {
    for (const auto& stops : stop_sets) {
      const std::string want = reference_output(text, stops);
      // Every cut into three pieces (empty pieces included).
      for (size_t i = 0; i <= text.size(); ++i) {
        for (size_t j = i; j <= text.size(); ++j) {
          StopMatcher matcher({.stop_strings = stops}, kEosIds);
          const std::vector<std::string> pieces = {text.substr(0, i), text.substr(i, j - i),
                                                   text.substr(j)};
          std::string emitted, pushed;
          bool stopped = false;
          for (const std::string& piece : pieces) {
            StopUpdate update = matcher.push(kText, piece);
            emitted += update.text;
            pushed += piece;
            if (update.finish) {
              stopped = true;
              break;
            }
            EXPECT_EQ(emitted, pushed.substr(0, reference_safe(pushed, stops)))
                << text << " cut at " << i << "," << j;
          }
          if (!stopped) emitted += matcher.finish(FinishReason::kLength).text;
          EXPECT_EQ(emitted, want) << text << " cut at " << i << "," << j;
          EXPECT_EQ(stopped, want.size() < text.size()) << text << " cut at " << i << "," << j;
        }
      }
    }
  }
}

}  // namespace
}  // namespace sieve::engine
