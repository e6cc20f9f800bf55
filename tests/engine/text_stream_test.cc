#include "engine/text_stream.h"

#include <gtest/gtest.h>

namespace sieve::engine {
namespace {

TEST(Utf8Stream, HoldsBackIncompleteCharacters) {
  Utf8Stream stream;
  const std::string euro = "\xE2\x82\xAC";  // U+20AC, three bytes
  EXPECT_EQ(stream.push("a"), "a");
  EXPECT_EQ(stream.push(euro.substr(0, 1)), "");
  EXPECT_EQ(stream.push(euro.substr(1, 1)), "");
  EXPECT_EQ(stream.push(euro.substr(2, 1) + "b"), euro + "b");
  EXPECT_EQ(stream.flush(), "");
}

TEST(Utf8Stream, FourByteCharacterSplitAcrossPieces) {
  Utf8Stream stream;
  const std::string emoji = "\xF0\x9F\x98\x80";
  std::string out;
  for (char byte : emoji) out += stream.push(std::string(1, byte));
  EXPECT_EQ(out, emoji);
}

TEST(Utf8Stream, FlushReturnsWhatIsHeld) {
  Utf8Stream stream;
  EXPECT_EQ(stream.push("x\xE2\x82"), "x");
  EXPECT_EQ(stream.flush(), "\xE2\x82");
  EXPECT_EQ(stream.flush(), "");
}

}  // namespace
}  // namespace sieve::engine
