// GGUF writer: round trips through the reader, exact layout, and misuse.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/gguf_test_util.h"
#include "shared_data.h"

namespace sieve::gguf {
namespace {

using ::testing::HasSubstr;

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

Value array_of(ValueType elem_type, std::vector<Value> items) {
  return Value{Array{elem_type, std::move(items)}};
}

// One key per value type, plus nested and empty arrays.
std::vector<KeyValue> every_value_type() {
  return {
      {"t.u8", Value{uint8_t{255}}},
      {"t.i8", Value{int8_t{-128}}},
      {"t.u16", Value{uint16_t{65535}}},
      {"t.i16", Value{int16_t{-32768}}},
      {"t.u32", Value{uint32_t{4294967295u}}},
      {"t.i32", Value{int32_t{-2147483647 - 1}}},
      {"t.f32", Value{-0.0f}},
      {"t.f32_inf", Value{std::numeric_limits<float>::infinity()}},
      {"t.f32_denorm", Value{std::numeric_limits<float>::denorm_min()}},
      {"t.bool_true", Value{true}},
      {"t.bool_false", Value{false}},
      {"t.string", Value{std::string("héllo\0world", 12)}},
      {"t.empty_string", Value{std::string()}},
      {"t.u64", Value{std::numeric_limits<uint64_t>::max()}},
      {"t.i64", Value{std::numeric_limits<int64_t>::min()}},
      {"t.f64", Value{3.141592653589793}},
      {"", Value{std::string("an empty key is legal")}},
      {"a.u8", array_of(ValueType::kUint8, {Value{uint8_t{1}}, Value{uint8_t{2}}})},
      {"a.i16", array_of(ValueType::kInt16, {Value{int16_t{-1}}})},
      {"a.f32", array_of(ValueType::kFloat32, {Value{1.5f}, Value{-2.25f}})},
      {"a.f64", array_of(ValueType::kFloat64, {Value{1e300}})},
      {"a.bool", array_of(ValueType::kBool, {Value{true}, Value{false}, Value{true}})},
      {"a.string", array_of(ValueType::kString, {Value{std::string("a")}, Value{std::string()}})},
      {"a.i64", array_of(ValueType::kInt64, {Value{int64_t{-5}}, Value{int64_t{7}}})},
      {"a.empty", array_of(ValueType::kUint32, {})},
      {"a.nested",
       array_of(ValueType::kArray,
                {array_of(ValueType::kUint8, {Value{uint8_t{7}}}),
                 array_of(ValueType::kString, {Value{std::string("inner")}}),
                 array_of(ValueType::kArray, {array_of(ValueType::kInt32, {Value{int32_t{-3}}})}),
                 array_of(ValueType::kFloat32, {})})},
  };
}

struct TensorCase {
  std::string name;
  TensorType type;
  std::vector<uint64_t> shape;
};

// Each supported type, an unsupported-but-known one, and sizes that need padding.
std::vector<TensorCase> tensor_cases() {
  return {
      {"f32", TensorType::kF32, {3}},  // 12 bytes, then 20 bytes of padding
      {"f16", TensorType::kF16, {5, 3}},    {"bf16", TensorType::kBF16, {7}},
      {"q8_0", TensorType::kQ8_0, {64, 2}}, {"q4_0", TensorType::kQ4_0, {32, 3, 2}},
      {"q4_k", TensorType::kQ4_K, {256}},   {"f32_4d", TensorType::kF32, {2, 1, 3, 2}},
      {"empty", TensorType::kF32, {0, 4}},
  };
}

Writer filled_writer() {
  Writer writer;
  for (const KeyValue& kv : every_value_type()) writer.set(kv.key, kv.value);
  uint64_t seed = 0;
  for (const TensorCase& t : tensor_cases()) {
    writer.add_tensor(t.name, t.type, t.shape,
                      random_bytes(tensor_num_bytes(t.type, t.shape), ++seed));
  }
  return writer;
}

TEST(GgufWriter, RoundTripsEveryValueTypeAndTensorType) {
  const auto path = (testing::temp_dir() / "all.gguf").string();
  filled_writer().write(path);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  const File file = File::open(path);
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.alignment(), 32u);
  EXPECT_EQ(file.metadata(), every_value_type());
  EXPECT_TRUE(std::signbit(std::get<float>(file.find("t.f32")->data)));

  const auto cases = tensor_cases();
  ASSERT_EQ(file.tensors().size(), cases.size());
  uint64_t seed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const TensorInfo& tensor = file.tensors()[i];
    SCOPED_TRACE(tensor.name);
    EXPECT_EQ(tensor.name, cases[i].name);
    EXPECT_EQ(tensor.type, cases[i].type);
    EXPECT_EQ(tensor.shape, cases[i].shape);
    const auto data = file.tensor_data(tensor);
    const auto expected = random_bytes(tensor.num_bytes, ++seed);
    EXPECT_TRUE(std::equal(data.begin(), data.end(), expected.begin(), expected.end()));
  }
  EXPECT_TRUE(is_supported(file.find_tensor("q4_k")->type));
}

TEST(GgufWriter, LayoutIsAlignedAndZeroPadded) {
  const std::vector<uint8_t> bytes = filled_writer().to_bytes();
  const File file = File::parse(bytes);
  const size_t data_start =
      static_cast<size_t>(file.tensor_data(file.tensors()[0]).data() - bytes.data());
  EXPECT_EQ(data_start % 32, 0u);
  uint64_t expected_offset = 0;
  for (const TensorInfo& tensor : file.tensors()) {
    SCOPED_TRACE(tensor.name);
    EXPECT_EQ(tensor.offset, expected_offset);
    const uint64_t padded_end = (tensor.offset + tensor.num_bytes + 31) / 32 * 32;
    for (uint64_t b = tensor.offset + tensor.num_bytes; b < padded_end; ++b) {
      EXPECT_EQ(bytes[data_start + b], 0) << "padding at data offset " << b;
    }
    expected_offset = padded_end;
  }
  EXPECT_EQ(bytes.size(), data_start + expected_offset);  // the last tensor is padded too
}

TEST(GgufWriter, RewritingStories260KIsByteIdentical) {
  const std::string path = sieve::testing::shared_path("models/stories260K.gguf");
  const File original = File::open(path);
  Writer writer;
  for (const KeyValue& kv : original.metadata()) writer.copy_from(original, kv.key);
  for (const TensorInfo& tensor : original.tensors()) {
    const auto data = original.tensor_data(tensor);
    writer.add_tensor(tensor.name, tensor.type, tensor.shape, {data.begin(), data.end()});
  }
  EXPECT_EQ(writer.to_bytes(), testing::read_bytes(path));
}

TEST(GgufWriter, CopiesVocabArrays) {
  const File vocab =
      File::open(sieve::testing::shared_path("golden/tokenizer/ggml-vocab-gpt-2.gguf"));
  Writer writer;
  writer.copy_from(vocab, "tokenizer.ggml.merges");
  writer.copy_from(vocab, "tokenizer.ggml.tokens");
  const auto bytes = writer.to_bytes();
  const File copy = File::parse(bytes);
  ASSERT_EQ(copy.metadata().size(), 2u);
  EXPECT_EQ(copy.metadata()[0].key, "tokenizer.ggml.merges");
  EXPECT_EQ(copy.get_string_array("tokenizer.ggml.tokens"),
            vocab.get_string_array("tokenizer.ggml.tokens"));
  EXPECT_EQ(*copy.find("tokenizer.ggml.merges"), *vocab.find("tokenizer.ggml.merges"));
  EXPECT_THAT([&] { writer.copy_from(vocab, "no.such.key"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("'no.such.key'")));
}

TEST(GgufWriter, SetReplacesInPlace) {
  Writer writer;
  writer.set_string("a", "first");
  writer.set_u32("b", 2);
  writer.set_f32("c", 0.5f);
  writer.set_bool("d", true);
  writer.set_u32("a", 1);
  const auto bytes = writer.to_bytes();
  const File file = File::parse(bytes);
  ASSERT_EQ(file.metadata().size(), 4u);
  EXPECT_EQ(file.metadata()[0].key, "a");
  EXPECT_EQ(file.metadata()[0].value, Value{uint32_t{1}});
  EXPECT_EQ(file.get_u64("b"), 2u);
  EXPECT_EQ(file.get_f64("c"), 0.5);
  EXPECT_EQ(file.get_bool("d"), true);
}

TEST(GgufWriter, CustomAlignment) {
  Writer writer = filled_writer();
  writer.set_u32("general.alignment", 256);
  const auto bytes = writer.to_bytes();
  const File file = File::parse(bytes);
  EXPECT_EQ(file.alignment(), 256u);
  const size_t data_start =
      static_cast<size_t>(file.tensor_data(file.tensors()[0]).data() - bytes.data());
  EXPECT_EQ(data_start % 256, 0u);
  for (const TensorInfo& tensor : file.tensors()) {
    EXPECT_EQ(tensor.offset % 256, 0u) << tensor.name;
    EXPECT_EQ(file.tensor_data(tensor).data(), bytes.data() + data_start + tensor.offset);
  }
  EXPECT_EQ(bytes.size() % 256, 0u);
}

TEST(GgufWriter, RejectsInvalidAlignment) {
  const auto dir = testing::temp_dir();
  const auto path = (dir / "bad.gguf").string();
  for (uint32_t bad : {0u, 3u, 48u}) {
    Writer writer = filled_writer();
    writer.set_u32("general.alignment", bad);
    EXPECT_THAT([&] { writer.write(path); },
                ::testing::ThrowsMessage<Error>(HasSubstr("not a nonzero power of two")));
  }
  Writer writer;
  writer.set("general.alignment", Value{uint64_t{32}});
  EXPECT_THAT([&] { writer.write(path); },
              ::testing::ThrowsMessage<Error>(HasSubstr("must be a uint32, not uint64")));
  EXPECT_TRUE(std::filesystem::is_empty(dir));  // neither the file nor its .tmp
}

TEST(GgufWriter, RejectsMalformedValues) {
  Writer writer;
  writer.set("mixed", array_of(ValueType::kUint8, {Value{uint8_t{1}}, Value{int8_t{2}}}));
  EXPECT_THAT([&] { writer.to_bytes(); },
              ::testing::ThrowsMessage<Error>(
                  HasSubstr("metadata key 'mixed': array of uint8 holds an item of type int8")));

  Value deep = Value{uint8_t{0}};
  for (int level = 0; level < 9; ++level) {
    const ValueType type = deep.type();
    deep = array_of(type, {std::move(deep)});
  }
  writer = Writer();
  writer.set("deep", deep);
  EXPECT_THAT([&] { writer.to_bytes(); },
              ::testing::ThrowsMessage<Error>(HasSubstr("nest deeper than 8")));
  writer.set("deep", std::get<Array>(deep.data).items[0]);  // 8 levels is the limit
  EXPECT_EQ(*File::parse(writer.to_bytes()).find("deep"), std::get<Array>(deep.data).items[0]);

  writer = Writer();
  writer.set("bad_elem", Value{Array{static_cast<ValueType>(13), {}}});
  EXPECT_THAT([&] { writer.to_bytes(); },
              ::testing::ThrowsMessage<Error>(HasSubstr("element type 13")));
}

TEST(GgufWriter, AddTensorRejectsMisuse) {
  Writer writer;
  writer.add_tensor("w", TensorType::kF32, {4}, std::vector<uint8_t>(16));
  EXPECT_THAT([&] { writer.add_tensor("w", TensorType::kF32, {4}, std::vector<uint8_t>(16)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("tensor 'w' was already added")));
  EXPECT_THAT([&] { writer.add_tensor("x", TensorType::kF32, {4}, std::vector<uint8_t>(15)); },
              ::testing::ThrowsMessage<Error>(
                  HasSubstr("tensor 'x': shape [4] of type F32 needs 16 bytes, got 15")));
  EXPECT_THAT([&] { writer.add_tensor("x", TensorType::kQ8_0, {16}, std::vector<uint8_t>(17)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("not a multiple of the Q8_0 block size")));
  EXPECT_THAT([&] { writer.add_tensor("x", TensorType::kF32, {}, {}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("1 to 4 dimensions, not 0")));
  EXPECT_THAT(
      [&] {
        writer.add_tensor("x", TensorType::kF32, {1, 1, 1, 1, 1}, {0, 0, 0, 0});
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("not 5")));
  EXPECT_THAT(
      [&] { writer.add_tensor("x", static_cast<TensorType>(99), {1}, {}); },
      ::testing::ThrowsMessage<Error>(HasSubstr("tensor 'x': unknown ggml tensor type id 99")));
  EXPECT_EQ(File::parse(writer.to_bytes()).tensors().size(), 1u);
}

TEST(GgufWriter, WriteReplacesAtomically) {
  const auto dir = testing::temp_dir();
  const auto path = (dir / "model.gguf").string();
  Writer first;
  first.set_string("which", "first");
  first.write(path);
  Writer second;
  second.set_string("which", "second");
  second.write(path);
  EXPECT_EQ(File::open(path).get_string("which"), "second");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            1);
  EXPECT_THAT([&] { second.write((dir / "no_such_dir" / "x.gguf").string()); },
              ::testing::ThrowsMessage<Error>(HasSubstr("cannot create")));
}

}  // namespace
}  // namespace sieve::gguf
