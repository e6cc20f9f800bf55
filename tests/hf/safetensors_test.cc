// The safetensors reader: well-formed single and sharded files, and a clear error naming the
// file for every kind of malformed input; random mutations of a valid file either parse or fail
// with sieve::Error (the libFuzzer target fuzz/safetensors_fuzz.cc does the same at scale).
#include "hf/safetensors.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <random>

#include "safetensors_writer.h"
#include "util/error.h"

namespace sieve {
namespace {

using hf::SafetensorsFile;
using hf::SafetensorsSet;
using testing::error_of;
using testing::StTensor;
namespace fs = std::filesystem;

std::vector<uint8_t> counting(size_t n) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 1);
  return bytes;
}

std::vector<StTensor> two_tensors() {
  return {{"a.weight", "F32", {2, 3}, counting(24)}, {"b.bias", "BF16", {5}, counting(10)}};
}

SafetensorsFile parse(const std::vector<uint8_t>& bytes) {
  return SafetensorsFile::parse(bytes, "test.safetensors");
}

SafetensorsFile parse_header(const std::string& header, size_t data_bytes) {
  static std::vector<uint8_t> bytes;  // kept alive for the returned file's spans
  bytes = testing::header_and_data(header, counting(data_bytes));
  return parse(bytes);
}

TEST(Safetensors, ReadsTensorsAndMetadata) {
  const auto bytes = testing::safetensors_bytes(two_tensors(), {{"format", "pt"}});
  const SafetensorsFile file = parse(bytes);
  ASSERT_EQ(file.tensors().size(), 2u);
  const hf::TensorInfo* a = file.find("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, hf::DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(a->num_elements(), 6u);
  const auto data = file.data(*a);
  EXPECT_EQ(std::vector<uint8_t>(data.begin(), data.end()), counting(24));
  const hf::TensorInfo* b = file.find("b.bias");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, hf::DType::kBF16);
  EXPECT_EQ(file.data(*b).size(), 10u);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.find("c"), nullptr);
}

TEST(Safetensors, TruncatedFilesAreErrorsNamingTheFile) {
  EXPECT_NE(error_of([] {
              parse({1, 2, 3});
            }).find("test.safetensors: truncated"),
            std::string::npos);
  auto bytes = testing::safetensors_bytes(two_tensors());
  // Cut inside the header: the length runs past the end.
  EXPECT_NE(error_of([&] {
              parse({bytes.begin(), bytes.begin() + 20});
            }).find("past the end"),
            std::string::npos);
  // Cut inside the data: the last tensor's offsets run past it.
  bytes.resize(bytes.size() - 3);
  EXPECT_NE(error_of([&] { parse(bytes); }).find("'b.bias'"), std::string::npos);
}

TEST(Safetensors, HeaderLengthPastTheEndIsAnError) {
  std::vector<uint8_t> bytes = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
  EXPECT_NE(error_of([&] { parse(bytes); }).find("runs past the end"), std::string::npos);
}

TEST(Safetensors, HostileJsonIsAnError) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_NE(error_of([&] { parse_header(deep, 0); }).find("nests deeper"), std::string::npos);
  EXPECT_NE(error_of([&] { parse_header("{\"a\": ", 0); }).find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_header("[1, 2]", 0); }).find("not a JSON object"),
            std::string::npos);
  // Numbers past double's range fail as JSON; past uint64, negative or fractional as offsets.
  for (const char* number : {"1e400", "18446744073709551616", "-4", "3.5", "1e3"}) {
    const std::string header =
        fmt::format(R"({{"t": {{"dtype": "U8", "shape": [4], "data_offsets": [0, {}]}}}})", number);
    const std::string error = error_of([&] { parse_header(header, 4); });
    EXPECT_NE(error.find("test.safetensors: "), std::string::npos) << error;
    EXPECT_TRUE(error.find("non-negative integer") != std::string::npos ||
                error.find("number overflow") != std::string::npos)
        << error;
  }
  // A shape whose element count overflows.
  const std::string huge =
      R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 4]}})";
  EXPECT_NE(error_of([&] { parse_header(huge, 4); }).find("too large"), std::string::npos);
  EXPECT_NE(error_of([&] { parse_header(R"({"t": 5})", 0); }).find("not a JSON object"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { parse_header(R"({"__metadata__": {"k": 1}})", 0); }).find("not a string"),
      std::string::npos);
}

TEST(Safetensors, OffsetsOutOfRangeOverlappingOrWithHolesAreErrors) {
  const auto header = [](int a0, int a1, int b0, int b1) {
    return fmt::format(R"({{"a": {{"dtype": "U8", "shape": [{}], "data_offsets": [{}, {}]}}, )"
                       R"("b": {{"dtype": "U8", "shape": [{}], "data_offsets": [{}, {}]}}}})",
                       a1 - a0, a0, a1, b1 - b0, b0, b1);
  };
  EXPECT_NO_THROW(parse_header(header(0, 4, 4, 8), 8));
  EXPECT_NE(error_of([&] { parse_header(header(0, 4, 4, 12), 8); }).find("past the end"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_header(header(0, 4, 2, 6), 6); }).find("overlap"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_header(header(0, 4, 6, 8), 8); }).find("unused bytes"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_header(header(0, 4, 4, 8), 10); }).find("after the last"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              parse_header(R"({"a": {"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}})", 4);
            }).find("end before they begin"),
            std::string::npos);
}

TEST(Safetensors, ShapeDtypeSizeMismatchAndUnknownDtypeAreErrors) {
  EXPECT_NE(error_of([&] {
              parse_header(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8);
            }).find("needs 12 bytes"),
            std::string::npos);
  const std::string unknown = error_of(
      [&] { parse_header(R"({"a": {"dtype": "F12", "shape": [1], "data_offsets": [0, 2]}})", 2); });
  EXPECT_NE(unknown.find("unknown dtype 'F12'"), std::string::npos);
  EXPECT_NE(unknown.find("test.safetensors"), std::string::npos);
  EXPECT_NE(error_of([&] {
              parse_header(R"({"a": {"shape": [1], "data_offsets": [0, 1]}})", 1);
            }).find("dtype"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              parse_header(
                  R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 1}})", 1);
            }).find("unknown field"),
            std::string::npos);
}

class ShardedFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("sieve_safetensors_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    testing::write_bytes(dir_ / "one.safetensors",
                         testing::safetensors_bytes({{"x", "F16", {2}, counting(4)}}));
    testing::write_bytes(dir_ / "two.safetensors",
                         testing::safetensors_bytes({{"y", "F32", {1}, counting(4)}}));
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write_index(const nlohmann::json& weight_map) {
    std::ofstream(dir_ / "model.safetensors.index.json")
        << nlohmann::json{{"metadata", {{"total_size", 8}}}, {"weight_map", weight_map}}.dump();
  }
  fs::path dir_;
};

TEST_F(ShardedFolder, ReadsEachTensorFromTheShardTheIndexNames) {
  write_index({{"x", "one.safetensors"}, {"y", "two.safetensors"}});
  const SafetensorsSet set = SafetensorsSet::open(dir_.string());
  EXPECT_EQ(set.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(set.files().size(), 2u);
  const auto y = set.find("y");
  ASSERT_TRUE(y.has_value());
  EXPECT_EQ(y->info->dtype, hf::DType::kF32);
  EXPECT_NE(y->file->find("two.safetensors"), std::string::npos);
  EXPECT_FALSE(set.find("z").has_value());
}

TEST_F(ShardedFolder, MissingShardWrongShardAndPathsAreErrorsNamingTheFile) {
  write_index({{"x", "one.safetensors"}, {"y", "three.safetensors"}});
  EXPECT_NE(error_of([&] { SafetensorsSet::open(dir_.string()); }).find("missing shard"),
            std::string::npos);
  write_index({{"x", "two.safetensors"}});
  EXPECT_NE(error_of([&] { SafetensorsSet::open(dir_.string()); }).find("does not hold it"),
            std::string::npos);
  write_index({{"x", "../one.safetensors"}});
  EXPECT_NE(error_of([&] { SafetensorsSet::open(dir_.string()); }).find("not a file name"),
            std::string::npos);
  std::ofstream(dir_ / "model.safetensors.index.json") << "{\"metadata\": {}}";
  EXPECT_NE(error_of([&] { SafetensorsSet::open(dir_.string()); }).find("weight_map"),
            std::string::npos);
}

TEST_F(ShardedFolder, AFolderOfSeveralFilesWithoutAnIndexIsAnError) {
  EXPECT_NE(error_of([&] { SafetensorsSet::open(dir_.string()); }).find("2 *.safetensors"),
            std::string::npos);
  // A file named directly is read alone.
  EXPECT_EQ(SafetensorsSet::open((dir_ / "one.safetensors").string()).names(),
            std::vector<std::string>{"x"});
}

// Random truncations, byte flips and header edits of a valid file: each either parses, with
// every tensor's bytes inside the input, or fails with sieve::Error.
TEST(Safetensors, RandomMutationsParseOrFailCleanly) {
  const std::vector<uint8_t> valid = testing::safetensors_bytes(two_tensors(), {{"k", "v"}});
  std::mt19937_64 rng(42);
  int parsed = 0, refused = 0;
  for (int round = 0; round < 4000; ++round) {
    std::vector<uint8_t> bytes = valid;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 4) {
        case 0:
          bytes.resize(rng() % (bytes.size() + 1));
          break;
        case 1:
          if (!bytes.empty()) bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
          break;
        case 2:  // a digit of the header changed: offsets, shapes and lengths
          if (bytes.size() > 8) {
            const size_t at = 8 + rng() % (bytes.size() - 8);
            if (bytes[at] >= '0' && bytes[at] <= '9') bytes[at] = '0' + rng() % 10;
          }
          break;
        default:
          if (!bytes.empty()) bytes[rng() % std::min<size_t>(8, bytes.size())] ^= 1 << (rng() % 8);
      }
    }
    try {
      const SafetensorsFile file = SafetensorsFile::parse(bytes, "mutated");
      for (const hf::TensorInfo& tensor : file.tensors()) {
        const auto data = file.data(tensor);
        ASSERT_GE(data.data(), bytes.data());
        ASSERT_LE(data.data() + data.size(), bytes.data() + bytes.size());
      }
      ++parsed;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("mutated"), std::string::npos) << error.what();
      ++refused;
    }
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace sieve
