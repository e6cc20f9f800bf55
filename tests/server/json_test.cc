// The server's JSON reading (server/json.h): keys in the order they came, a repeated key's last
// value in its first place (Python's json), linear time in the number of keys.
#include "server/json.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sieve::server {
namespace {

std::vector<std::string> keys_of(const json& object) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.push_back(key);
  return keys;
}

TEST(ParseJson, KeepsTheKeysInTheirOrder) {
  const auto doc =
      parse_json(R"({"name": "Ann", "age": 3, "friends": [{"zed": 1, "amy": 2}], "has_pet": true,)"
                 R"( "mood": null})");
  ASSERT_TRUE(doc);
  EXPECT_EQ(keys_of(*doc), (std::vector<std::string>{"name", "age", "friends", "has_pet", "mood"}));
  EXPECT_EQ(keys_of((*doc)["friends"][0]), (std::vector<std::string>{"zed", "amy"}));
  EXPECT_EQ(doc->dump(),
            R"({"name":"Ann","age":3,"friends":[{"zed":1,"amy":2}],"has_pet":true,"mood":null})");
}

TEST(ParseJson, ARepeatedKeyKeepsItsFirstPlaceAndItsLastValue) {
  // As Python's json.loads: {"b": 3, "a": 2}.
  const auto doc = parse_json(R"({"b": 1, "a": 2, "b": {"x": 1}, "c": [], "b": 3})");
  ASSERT_TRUE(doc);
  EXPECT_EQ(doc->dump(), R"({"b":3,"a":2,"c":[]})");
  const auto nested = parse_json(R"([{"k": 1, "k": 2}, {"k": 3}])");
  ASSERT_TRUE(nested);
  EXPECT_EQ(nested->dump(), R"([{"k":2},{"k":3}])");
}

TEST(ParseJson, ValuesOfEveryKind) {
  const auto doc =
      parse_json(R"([null, true, false, -7, 18446744073709551615, 2.5, "é\n", {}, []])");
  ASSERT_TRUE(doc);
  ASSERT_EQ(doc->size(), 9u);
  EXPECT_TRUE((*doc)[0].is_null());
  EXPECT_EQ((*doc)[1], true);
  EXPECT_EQ((*doc)[3].get<int64_t>(), -7);
  EXPECT_EQ((*doc)[4].get<uint64_t>(), 18446744073709551615u);
  EXPECT_EQ((*doc)[5].get<double>(), 2.5);
  EXPECT_EQ((*doc)[6], "é\n");
  EXPECT_TRUE((*doc)[7].is_object() && (*doc)[7].empty());
  EXPECT_TRUE((*doc)[8].is_array() && (*doc)[8].empty());
  EXPECT_EQ(parse_json("42").value(), 42);
  EXPECT_EQ(parse_json(R"("s")").value(), "s");
}

TEST(ParseJson, RefusesWhatIsNotJson) {
  for (const std::string text : {"", "{", R"({"a":})", R"({"a":1,})", "[1] x", "nul", "1e400",
                                 "{\"a\":\"\xff\"}", "{'a': 1}", "[1,]"}) {
    EXPECT_FALSE(parse_json(text)) << text;
  }
}

TEST(ParseJson, ManyKeysKeepTheirOrder) {
  // Enough keys that a scan per key (nlohmann's ordered parse) would be slow, in descending
  // order so that a sorted map would reverse them.
  constexpr int kKeys = 200000;
  std::string text = "{";
  for (int i = kKeys; i > 0; --i)
    text += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  text += "\"k1\":0}";  // a repeat of the last key
  const auto doc = parse_json(text);
  ASSERT_TRUE(doc);
  ASSERT_EQ(doc->size(), static_cast<size_t>(kKeys));
  EXPECT_EQ(doc->begin().key(), "k" + std::to_string(kKeys));
  EXPECT_EQ(std::prev(doc->end()).key(), "k1");
  EXPECT_EQ(doc->back(), 0);
}

// What walks a document recurses once per level: 10^5 nested levels would overflow a stack.
TEST(ParseJson, NestingDeeperThanTheLimitIsRefusedAsSuch) {
  const auto nested = [](size_t depth, const std::string& open, const std::string& close) {
    std::string text;
    for (size_t i = 0; i < depth; ++i) text += open;
    text += "1";
    for (size_t i = 0; i < depth; ++i) text += close;
    return text;
  };
  JsonError error = JsonError::kTooDeep;
  const auto deepest = parse_json(nested(kMaxJsonDepth, "[", "]"), &error);
  ASSERT_TRUE(deepest);
  EXPECT_EQ(deepest->dump().size(), 2 * kMaxJsonDepth + 1);
  for (size_t depth : {kMaxJsonDepth + 1, size_t{100000}}) {
    error = JsonError::kInvalid;
    EXPECT_FALSE(parse_json(nested(depth, "[", "]"), &error)) << depth;
    EXPECT_EQ(error, JsonError::kTooDeep) << depth;
    error = JsonError::kInvalid;
    EXPECT_FALSE(parse_json(nested(depth, "{\"k\":", "}"), &error)) << depth;
    EXPECT_EQ(error, JsonError::kTooDeep) << depth;
  }
  // Invalid text says so, also when it is deep (the depth is seen first only when it is reached).
  error = JsonError::kTooDeep;
  EXPECT_FALSE(parse_json("[[1,]]", &error));
  EXPECT_EQ(error, JsonError::kInvalid);
}

}  // namespace
}  // namespace sieve::server
