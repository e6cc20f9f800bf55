// GGUF reader: real files from ../shared, then systematically corrupted copies of them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/gguf_test_util.h"
#include "shared_data.h"

namespace sieve::gguf {
namespace {

using testing::find_bytes;
using ::testing::HasSubstr;
using testing::locate_tensor_info;
using testing::locate_value_type;
using testing::parse_error;
using testing::patch;
using testing::RawGguf;

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

std::string stories_path() { return sieve::testing::shared_path("models/stories260K.gguf"); }

// Bytes of stories260K.gguf, read once. Tests patch their own copies.
const std::vector<uint8_t>& stories_bytes() {
  static const std::vector<uint8_t> bytes = testing::read_bytes(stories_path());
  return bytes;
}

// End of stories260K.gguf's tensor-info section and start of its data section.
constexpr size_t kStoriesHeaderEnd = 14152;
constexpr size_t kStoriesDataStart = 14176;

// ---- The real files --------------------------------------------------------------------------

TEST(GgufReader, Stories260KHeader) {
  const File file = File::open(stories_path());
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.alignment(), 32u);
  EXPECT_EQ(file.metadata().size(), 19u);
  EXPECT_EQ(file.metadata().front().key, "tokenizer.ggml.tokens");
  EXPECT_EQ(file.get_string("general.architecture"), "llama");
  EXPECT_EQ(file.get_u64("llama.embedding_length"), 64u);
  EXPECT_EQ(file.get_u64("llama.block_count"), 5u);
  EXPECT_EQ(file.get_u64("llama.context_length"), 512u);
  EXPECT_EQ(file.get_u64("llama.feed_forward_length"), 172u);
  EXPECT_EQ(file.get_i64("llama.attention.head_count"), 8);
  EXPECT_EQ(file.get_i64("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(file.get_u64("tokenizer.ggml.seperator_token_id"), 4294967295u);
  EXPECT_NEAR(*file.get_f64("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-12);
  EXPECT_EQ(file.get_f64("llama.block_count"), 5.0);  // integers widen to double

  const auto tokens = file.get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.has_value());
  ASSERT_EQ(tokens->size(), 512u);
  EXPECT_EQ((*tokens)[0], "<unk>");
  EXPECT_EQ((*tokens)[1], "<s>");
  EXPECT_EQ((*tokens)[3], "<0x00>");
  EXPECT_EQ((*tokens)[258], "<0xFF>");
  EXPECT_EQ(file.get_f32_array("tokenizer.ggml.scores")->size(), 512u);
  const auto token_types = file.get_i32_array("tokenizer.ggml.token_type");
  ASSERT_EQ(token_types->size(), 512u);
  EXPECT_EQ((*token_types)[0], 2);  // unknown
  EXPECT_EQ((*token_types)[1], 3);  // control
  EXPECT_EQ((*token_types)[3], 6);  // byte
}

TEST(GgufReader, Stories260KTensors) {
  const File file = File::open(stories_path());
  ASSERT_EQ(file.tensors().size(), 48u);
  uint64_t num_values = 0;
  for (const TensorInfo& tensor : file.tensors()) {
    EXPECT_EQ(tensor.type, TensorType::kF32) << tensor.name;
    EXPECT_TRUE(is_supported(tensor.type));
    EXPECT_EQ(tensor.offset % 32, 0u);
    EXPECT_EQ(tensor.num_bytes, tensor.num_elements() * 4);
    EXPECT_EQ(file.tensor_data(tensor).size(), tensor.num_bytes);
    EXPECT_EQ(file.find_tensor(tensor.name), &tensor);
    num_values += tensor.num_elements();
  }
  EXPECT_EQ(num_values, 292800u);

  const TensorInfo* embd = file.find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->shape, (std::vector<uint64_t>{64, 512}));
  EXPECT_EQ(embd->offset, 0u);
  EXPECT_EQ(embd->num_bytes, 64u * 512 * 4);
  EXPECT_EQ(file.find_tensor("output_norm.weight")->shape, (std::vector<uint64_t>{64}));
  EXPECT_EQ(file.find_tensor("blk.4.ffn_gate.weight")->shape, (std::vector<uint64_t>{64, 172}));
  EXPECT_EQ(file.find_tensor("no.such.tensor"), nullptr);

  // The embedding is the first matrix of the llama2.c checkpoint, after its 28-byte header.
  const auto checkpoint =
      testing::read_bytes(sieve::testing::shared_path("models/stories260K.bin"));
  const auto data = file.tensor_data(*embd);
  ASSERT_GE(checkpoint.size(), 28 + data.size());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), checkpoint.begin() + 28));
  // llama2.c shares the output matrix with the embedding.
  const auto output = file.tensor_data(*file.find_tensor("output.weight"));
  EXPECT_TRUE(std::equal(data.begin(), data.end(), output.begin(), output.end()));
}

TEST(GgufReader, ParseMatchesOpen) {
  const File opened = File::open(stories_path());
  const File parsed = File::parse(stories_bytes());
  EXPECT_EQ(parsed.metadata(), opened.metadata());
  ASSERT_EQ(parsed.tensors().size(), opened.tensors().size());
  for (size_t i = 0; i < parsed.tensors().size(); ++i) {
    const auto a = parsed.tensor_data(parsed.tensors()[i]);
    const auto b = opened.tensor_data(opened.tensors()[i]);
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
  }
}

TEST(GgufReader, MovedFileKeepsItsData) {
  File file = File::open(stories_path());
  File moved = std::move(file);
  const auto data = moved.tensor_data(*moved.find_tensor("output_norm.weight"));
  EXPECT_EQ(data.size(), 256u);
  EXPECT_EQ(moved.get_u64("llama.block_count"), 5u);
}

struct VocabCase {
  const char* file;
  uint64_t num_tokens;
  bool has_merges;
};

TEST(GgufReader, VocabOnlyFiles) {
  for (const VocabCase& c : {VocabCase{"ggml-vocab-llama-spm.gguf", 32000, false},
                             VocabCase{"ggml-vocab-gpt-2.gguf", 50257, true},
                             VocabCase{"ggml-vocab-deepseek-llm.gguf", 102400, true}}) {
    SCOPED_TRACE(c.file);
    const File file =
        File::open(sieve::testing::shared_path(std::string("golden/tokenizer/") + c.file));
    EXPECT_EQ(file.version(), 3u);
    EXPECT_TRUE(file.tensors().empty());
    EXPECT_EQ(file.get_string_array("tokenizer.ggml.tokens")->size(), c.num_tokens);
    EXPECT_EQ(file.get_i32_array("tokenizer.ggml.token_type")->size(), c.num_tokens);
    EXPECT_EQ(file.get_string_array("tokenizer.ggml.merges").has_value(), c.has_merges);
  }
  const File spm =
      File::open(sieve::testing::shared_path("golden/tokenizer/ggml-vocab-llama-spm.gguf"));
  EXPECT_EQ(spm.get_bool("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(spm.get_bool("tokenizer.ggml.add_eos_token"), false);
  EXPECT_EQ(spm.get_string("tokenizer.ggml.model"), "llama");
}

// ---- Typed getters ---------------------------------------------------------------------------

TEST(GgufReader, AbsentKeysAreNullopt) {
  const File file = File::parse(stories_bytes());
  EXPECT_EQ(file.find("no.such.key"), nullptr);
  EXPECT_FALSE(file.get_string("no.such.key"));
  EXPECT_FALSE(file.get_u64("no.such.key"));
  EXPECT_FALSE(file.get_i64("no.such.key"));
  EXPECT_FALSE(file.get_f64("no.such.key"));
  EXPECT_FALSE(file.get_bool("no.such.key"));
  EXPECT_FALSE(file.get_string_array("no.such.key"));
  EXPECT_FALSE(file.get_f32_array("no.such.key"));
  EXPECT_FALSE(file.get_i32_array("no.such.key"));
}

std::string getter_error(const std::function<void()>& get) {
  try {
    get();
  } catch (const FormatError& e) {
    return e.what();
  }
  ADD_FAILURE() << "getter did not throw";
  return {};
}

TEST(GgufReader, GetterTypeErrorsNameKeyAndTypes) {
  const File file = File::parse(stories_bytes());
  std::string message = getter_error([&] { file.get_string("llama.block_count"); });
  EXPECT_THAT(message, HasSubstr("'llama.block_count'"));
  EXPECT_THAT(message, HasSubstr("uint32"));
  EXPECT_THAT(message, HasSubstr("string"));
  message = getter_error([&] { file.get_u64("general.architecture"); });
  EXPECT_THAT(message, HasSubstr("'general.architecture' has type string, expected an integer"));
  EXPECT_THAT(getter_error([&] { file.get_i64("llama.attention.layer_norm_rms_epsilon"); }),
              HasSubstr("has type float32"));
  EXPECT_THAT(getter_error([&] { file.get_f64("tokenizer.ggml.tokens"); }),
              HasSubstr("has type array of string, expected a number"));
  EXPECT_THAT(getter_error([&] { file.get_bool("llama.block_count"); }),
              HasSubstr("expected bool"));
  EXPECT_THAT(getter_error([&] { file.get_f32_array("tokenizer.ggml.tokens"); }),
              HasSubstr("has type array of string, expected array of float32"));
  EXPECT_THAT(getter_error([&] { file.get_string_array("tokenizer.ggml.scores"); }),
              HasSubstr("has type array of float32, expected array of string"));
  EXPECT_THAT(getter_error([&] { file.get_i32_array("tokenizer.ggml.scores"); }),
              HasSubstr("'tokenizer.ggml.scores' has type array of float32"));
  EXPECT_THAT(getter_error([&] { file.get_i32_array("llama.block_count"); }),
              HasSubstr("has type uint32"));
}

File file_with(const std::function<void(Writer&)>& fill, std::vector<uint8_t>& storage) {
  Writer writer;
  fill(writer);
  storage = writer.to_bytes();
  return File::parse(storage);
}

TEST(GgufReader, IntegerGettersCheckRange) {
  std::vector<uint8_t> storage;
  const File file = file_with(
      [](Writer& w) {
        w.set("neg", Value{int32_t{-1}});
        w.set("small", Value{int8_t{-7}});
        w.set("byte", Value{uint8_t{200}});
        w.set("big", Value{uint64_t{1} << 63});
        w.set("u16s",
              Value{Array{ValueType::kUint16, {Value{uint16_t{1}}, Value{uint16_t{65535}}}}});
        w.set("too_big_for_i32", Value{Array{ValueType::kUint32, {Value{uint32_t{1u << 31}}}}});
        w.set("f64", Value{2.5});
      },
      storage);
  EXPECT_EQ(file.get_i64("neg"), -1);
  EXPECT_EQ(file.get_i64("small"), -7);
  EXPECT_EQ(file.get_u64("byte"), 200u);
  EXPECT_EQ(file.get_u64("big"), uint64_t{1} << 63);
  EXPECT_EQ(file.get_f64("f64"), 2.5);
  EXPECT_EQ(file.get_f64("neg"), -1.0);
  EXPECT_THAT(getter_error([&] { file.get_u64("neg"); }),
              HasSubstr("'neg' is -1, which does not fit in uint64"));
  EXPECT_THAT(getter_error([&] { file.get_i64("big"); }),
              HasSubstr("'big' is 9223372036854775808, which does not fit in int64"));
  EXPECT_EQ(file.get_i32_array("u16s"), (std::vector<int32_t>{1, 65535}));
  EXPECT_THAT(getter_error([&] { file.get_i32_array("too_big_for_i32"); }),
              HasSubstr("does not fit in int32"));
}

// ---- Truncation ------------------------------------------------------------------------------

TEST(GgufReader, EveryTruncatedHeaderIsRejected) {
  const auto& bytes = stories_bytes();
  ASSERT_EQ(find_bytes(bytes, "blk.4.ffn_norm.weight") + 21 + 4 + 8 + 4 + 8, kStoriesHeaderEnd);
  for (size_t length = 0; length <= kStoriesDataStart; ++length) {
    const std::string message = parse_error({bytes.data(), length});
    if (::testing::Test::HasFailure()) {
      FAIL() << "at length " << length;
    }
    if (length < 4) {
      EXPECT_THAT(message, HasSubstr("too small"));
    }
  }
}

TEST(GgufReader, TruncatedTensorDataIsRejected) {
  const auto& bytes = stories_bytes();
  for (size_t length = kStoriesDataStart; length < bytes.size(); length += 997) {
    EXPECT_THAT(parse_error({bytes.data(), length}), HasSubstr("run past the end of the file"));
  }
  EXPECT_THAT(parse_error({bytes.data(), bytes.size() - 1}),
              HasSubstr("tensor 'blk.4.ffn_norm.weight'"));
}

TEST(GgufReader, TruncatedVocabIsRejected) {
  const auto bytes = testing::read_bytes(
      sieve::testing::shared_path("golden/tokenizer/ggml-vocab-llama-spm.gguf"));
  for (size_t length = 0; length < 4096; ++length) {
    parse_error({bytes.data(), length});
    if (::testing::Test::HasFailure()) FAIL() << "at length " << length;
  }
  for (size_t length = 4096; length < bytes.size(); length += 7919) {
    EXPECT_THAT(parse_error({bytes.data(), length}), HasSubstr("remain"));
  }
  EXPECT_THAT(parse_error({bytes.data(), bytes.size() - 1}),
              HasSubstr("metadata key 'tokenizer.ggml.add_eos_token'"));
}

TEST(GgufReader, OpenNamesThePath) {
  const auto dir = testing::temp_dir();
  const std::string path = (dir / "truncated.gguf").string();
  testing::write_bytes(path, {stories_bytes().data(), 1000});
  try {
    File::open(path);
    FAIL() << "opened a truncated file";
  } catch (const FormatError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path + ": "));
  }
  EXPECT_THROW(File::open((dir / "missing.gguf").string()), Error);
  EXPECT_THROW(File::open(dir.string()), Error);  // a folder
  testing::write_bytes(path, {});
  EXPECT_THROW(File::open(path), FormatError);
}

// ---- Corrupted fields ------------------------------------------------------------------------

TEST(GgufReader, BadMagic) {
  for (size_t i = 0; i < 4; ++i) {
    auto bytes = stories_bytes();
    bytes[i] ^= 0x20;
    EXPECT_THAT(parse_error(bytes), HasSubstr("not a GGUF file"));
  }
}

TEST(GgufReader, Versions) {
  auto bytes = stories_bytes();
  patch<uint32_t>(bytes, 4, 1);
  EXPECT_THAT(parse_error(bytes), HasSubstr("GGUF version 1 is not supported"));
  patch<uint32_t>(bytes, 4, 4);
  EXPECT_THAT(parse_error(bytes), HasSubstr("unsupported GGUF version 4"));
  patch<uint32_t>(bytes, 4, 0x03000000);
  EXPECT_THAT(parse_error(bytes), HasSubstr("big-endian"));
  patch<uint32_t>(bytes, 4, 2);  // v2 has the v3 layout
  const File file = File::parse(bytes);
  EXPECT_EQ(file.version(), 2u);
  EXPECT_EQ(file.tensors().size(), 48u);
}

TEST(GgufReader, HugeCounts) {
  const auto& original = stories_bytes();
  for (uint64_t count : {kU64Max, kU64Max / 13, uint64_t{1} << 60, uint64_t{1000000}}) {
    SCOPED_TRACE(count);
    auto bytes = original;
    patch<uint64_t>(bytes, 8, count);  // tensor count
    EXPECT_THAT(parse_error(bytes), HasSubstr("tensor count at byte 8"));
    bytes = original;
    patch<uint64_t>(bytes, 16, count);  // metadata count
    EXPECT_THAT(parse_error(bytes), HasSubstr("metadata count at byte 16"));
  }
  // Counts that fit the file but disagree with its contents: the next section is read as
  // this one. Fewer tensors is a valid file; everything else must fail cleanly.
  for (uint64_t count : {0, 18, 20, 49, 300}) {
    auto bytes = original;
    patch<uint64_t>(bytes, 16, count);
    parse_error(bytes);
    bytes = original;
    patch<uint64_t>(bytes, 8, count);
    if (count < 48) {
      EXPECT_EQ(File::parse(bytes).tensors().size(), count);
    } else {
      parse_error(bytes);
    }
  }
}

TEST(GgufReader, HugeStringLengths) {
  const auto& original = stories_bytes();
  const uint64_t remaining = original.size() - 32;
  for (uint64_t length : {kU64Max, kU64Max - 7, remaining + 1}) {
    auto bytes = original;
    patch<uint64_t>(bytes, 24, length);  // the first key's length
    const std::string message = parse_error(bytes);
    EXPECT_THAT(message, HasSubstr("metadata entry 0 at byte 24"));
    EXPECT_THAT(message, HasSubstr("has length " + std::to_string(length)));
  }
  // A string value: general.architecture's "llama".
  auto bytes = original;
  const size_t value_length = locate_value_type(bytes, "general.architecture") + 4;
  patch<uint64_t>(bytes, value_length, kU64Max);
  EXPECT_THAT(parse_error(bytes), HasSubstr("metadata key 'general.architecture'"));
  // A tensor name.
  bytes = original;
  patch<uint64_t>(bytes, find_bytes(bytes, "output_norm.weight") - 8, kU64Max);
  EXPECT_THAT(parse_error(bytes), HasSubstr("tensor info 1 at byte"));
}

TEST(GgufReader, HugeArrayCounts) {
  const auto& original = stories_bytes();
  // tokenizer.ggml.tokens: u32 type, u32 elem type, u64 count.
  const size_t count_offset = locate_value_type(original, "tokenizer.ggml.tokens") + 8;
  for (uint64_t count : {kU64Max, kU64Max / 8 + 1, uint64_t{1} << 40, original.size() / 8}) {
    auto bytes = original;
    patch<uint64_t>(bytes, count_offset, count);
    const std::string message = parse_error(bytes);
    EXPECT_THAT(message, HasSubstr("metadata key 'tokenizer.ggml.tokens'"));
    EXPECT_THAT(message, HasSubstr("array length at byte " + std::to_string(count_offset)));
  }
  // Scalar arrays: each element takes its exact size.
  auto bytes = original;
  const size_t scores_count = locate_value_type(bytes, "tokenizer.ggml.scores") + 8;
  patch<uint64_t>(bytes, scores_count, kU64Max / 4 + 1);
  EXPECT_THAT(parse_error(bytes), HasSubstr("each needs at least 4"));
}

TEST(GgufReader, UnknownValueTypes) {
  const auto& original = stories_bytes();
  for (uint32_t type : {13u, 100u, 0xFFFFFFFFu}) {
    auto bytes = original;
    patch<uint32_t>(bytes, locate_value_type(bytes, "general.architecture"), type);
    const std::string message = parse_error(bytes);
    EXPECT_THAT(message, HasSubstr("metadata key 'general.architecture'"));
    EXPECT_THAT(message, HasSubstr("unknown value type " + std::to_string(type)));
    bytes = original;
    patch<uint32_t>(bytes, locate_value_type(bytes, "tokenizer.ggml.tokens") + 4, type);
    EXPECT_THAT(parse_error(bytes), HasSubstr("unknown element type " + std::to_string(type)));
  }
}

TEST(GgufReader, InvalidBool) {
  auto bytes = testing::read_bytes(
      sieve::testing::shared_path("golden/tokenizer/ggml-vocab-llama-spm.gguf"));
  const size_t value = locate_value_type(bytes, "tokenizer.ggml.add_bos_token") + 4;
  ASSERT_EQ(bytes[value], 1);
  bytes[value] = 2;
  const std::string message = parse_error(bytes);
  EXPECT_THAT(message, HasSubstr("metadata key 'tokenizer.ggml.add_bos_token'"));
  EXPECT_THAT(message, HasSubstr("bool at byte " + std::to_string(value) + " is 2"));
}

TEST(GgufReader, DuplicateKey) {
  auto bytes = stories_bytes();
  bytes[find_bytes(bytes, "tokenizer.ggml.bos_token_id") + 15] = 'e';
  EXPECT_THAT(parse_error(bytes),
              HasSubstr("duplicate metadata key 'tokenizer.ggml.eos_token_id' (entries 7 and 8"));
}

TEST(GgufReader, DuplicateTensorName) {
  auto bytes = stories_bytes();
  bytes[find_bytes(bytes, "blk.1.attn_q.weight") + 4] = '0';
  EXPECT_THAT(parse_error(bytes), HasSubstr("duplicate tensor name 'blk.0.attn_q.weight'"));
}

TEST(GgufReader, BadDimensionCounts) {
  for (uint32_t num_dims : {0u, 5u, 0xFFFFFFFFu}) {
    auto bytes = stories_bytes();
    patch<uint32_t>(bytes, locate_tensor_info(bytes, "token_embd.weight").num_dims, num_dims);
    const std::string message = parse_error(bytes);
    EXPECT_THAT(message, HasSubstr("tensor 'token_embd.weight'"));
    EXPECT_THAT(message, HasSubstr("dimension count at byte"));
    EXPECT_THAT(message, HasSubstr("is " + std::to_string(num_dims) + " (must be 1 to 4)"));
  }
}

TEST(GgufReader, UnknownTensorType) {
  for (uint32_t type : {4u, 31u, 99u, 0xFFFFFFFFu}) {
    auto bytes = stories_bytes();
    patch<uint32_t>(bytes, locate_tensor_info(bytes, "token_embd.weight").type, type);
    const std::string message = parse_error(bytes);
    EXPECT_THAT(message, HasSubstr("tensor 'token_embd.weight'"));
    EXPECT_THAT(message, HasSubstr("unknown ggml tensor type id " + std::to_string(type)));
  }
}

TEST(GgufReader, KnownTensorTypesAreAcceptedWhetherOrNotSieveComputesWithThem) {
  auto bytes = stories_bytes();
  const auto fields = locate_tensor_info(bytes, "token_embd.weight");
  patch<uint32_t>(bytes, fields.type, static_cast<uint32_t>(TensorType::kI32));  // also 4 bytes
  File file = File::parse(bytes);
  EXPECT_EQ(file.find_tensor("token_embd.weight")->type, TensorType::kI32);
  EXPECT_FALSE(is_supported(TensorType::kI32));

  // Q4_K needs rows of 256: [256, 8] takes 8 blocks of 144 bytes, less than the 131072 there.
  patch<uint32_t>(bytes, fields.type, static_cast<uint32_t>(TensorType::kQ4_K));
  patch<uint64_t>(bytes, fields.dims, 256);
  patch<uint64_t>(bytes, fields.dims + 8, 8);
  file = File::parse(bytes);
  const TensorInfo* tensor = file.find_tensor("token_embd.weight");
  EXPECT_EQ(tensor->type, TensorType::kQ4_K);
  EXPECT_EQ(tensor->num_bytes, 8u * 144);
  EXPECT_TRUE(is_supported(tensor->type));
  EXPECT_EQ(to_string(tensor->type), "Q4_K");

  // TQ2_0 (ternary, 66 bytes per 256) is known to the reader but not computed with.
  patch<uint32_t>(bytes, fields.type, static_cast<uint32_t>(TensorType::kTQ2_0));
  file = File::parse(bytes);
  tensor = file.find_tensor("token_embd.weight");
  EXPECT_EQ(tensor->num_bytes, 8u * 66);
  EXPECT_FALSE(is_supported(tensor->type));
  EXPECT_EQ(to_string(tensor->type), "TQ2_0");
}

TEST(GgufReader, RowLengthMustBeMultipleOfBlock) {
  auto bytes = stories_bytes();
  patch<uint32_t>(bytes, locate_tensor_info(bytes, "token_embd.weight").type,
                  static_cast<uint32_t>(TensorType::kQ4_K));
  const std::string message = parse_error(bytes);
  EXPECT_THAT(message, HasSubstr("tensor 'token_embd.weight'"));
  EXPECT_THAT(message, HasSubstr("row length 64 is not a multiple of the Q4_K block size 256"));
}

TEST(GgufReader, TensorOffsets) {
  const auto& original = stories_bytes();
  const auto fields = locate_tensor_info(original, "output_norm.weight");
  for (uint64_t offset : {uint64_t{1} << 40, kU64Max - 31, uint64_t{original.size()}}) {
    auto bytes = original;
    patch<uint64_t>(bytes, fields.offset, offset);
    const std::string message = parse_error(bytes);
    EXPECT_THAT(message, HasSubstr("tensor 'output_norm.weight'"));
    EXPECT_THAT(message, HasSubstr("run past the end of the file"));
  }
  auto bytes = original;
  patch<uint64_t>(bytes, fields.offset, 131072 + 16);
  EXPECT_THAT(parse_error(bytes),
              HasSubstr("data offset 131088 is not a multiple of the alignment 32"));
  // Overlapping tensors are allowed.
  patch<uint64_t>(bytes, fields.offset, 0);
  const File file = File::parse(bytes);
  EXPECT_EQ(file.tensor_data(*file.find_tensor("output_norm.weight")).data(),
            file.tensor_data(*file.find_tensor("token_embd.weight")).data());
}

TEST(GgufReader, ShapeOverflow) {
  auto bytes = stories_bytes();
  const auto fields = locate_tensor_info(bytes, "token_embd.weight");
  patch<uint64_t>(bytes, fields.dims, uint64_t{1} << 62);
  patch<uint64_t>(bytes, fields.dims + 8, uint64_t{1} << 62);
  EXPECT_THAT(parse_error(bytes), HasSubstr("has 2^64 or more elements"));
  patch<uint64_t>(bytes, fields.dims, uint64_t{1} << 32);
  patch<uint64_t>(bytes, fields.dims + 8, uint64_t{1} << 31);  // 2^63 elements, 2^65 bytes
  EXPECT_THAT(parse_error(bytes), HasSubstr("larger than 2^64 bytes"));
  patch<uint64_t>(bytes, fields.dims, kU64Max);
  EXPECT_THAT(parse_error(bytes), HasSubstr("above ggml's limit"));
  // A zero dimension makes an empty tensor, whatever the others are.
  patch<uint64_t>(bytes, fields.dims, 0);
  patch<uint64_t>(bytes, fields.dims + 8, uint64_t{1} << 62);
  const File file = File::parse(bytes);
  EXPECT_EQ(file.find_tensor("token_embd.weight")->num_bytes, 0u);
  EXPECT_TRUE(file.tensor_data(*file.find_tensor("token_embd.weight")).empty());
}

// ---- Hand-built files ------------------------------------------------------------------------

TEST(GgufReader, Alignment) {
  auto build = [](RawGguf kv, size_t pad_to) {
    RawGguf raw;
    raw.header(1, 1).raw({reinterpret_cast<const char*>(kv.bytes().data()), kv.size()});
    raw.tensor("t", {8}, TensorType::kF32, 0).pad(pad_to).zeros(32);
    return raw.bytes();
  };
  const auto aligned64 = build(RawGguf().kv_u32("general.alignment", 64), 64);
  const File file = File::parse(aligned64);
  EXPECT_EQ(file.alignment(), 64u);
  EXPECT_EQ(file.tensor_data(file.tensors()[0]).data() - aligned64.data(),
            static_cast<ptrdiff_t>(aligned64.size() - 32));

  for (uint32_t bad : {0u, 48u, 0x80000001u}) {
    EXPECT_THAT(parse_error(build(RawGguf().kv_u32("general.alignment", bad), 64)),
                HasSubstr("'general.alignment' is " + std::to_string(bad) +
                          ", not a nonzero power of two"));
  }
  RawGguf as_u64;
  as_u64.str("general.alignment").u32(static_cast<uint32_t>(ValueType::kUint64)).u64(32);
  EXPECT_THAT(parse_error(build(as_u64, 32)),
              HasSubstr("'general.alignment' has type uint64, expected uint32"));
}

RawGguf nested_arrays(int depth) {
  RawGguf raw;
  raw.header(0, 1).str("nested").u32(static_cast<uint32_t>(ValueType::kArray));
  for (int level = 1; level < depth; ++level)
    raw.u32(static_cast<uint32_t>(ValueType::kArray)).u64(1);
  raw.u32(static_cast<uint32_t>(ValueType::kUint8)).u64(1).u8(42);
  return raw;
}

TEST(GgufReader, NestedArrays) {
  const auto ok = nested_arrays(8).bytes();
  const File file = File::parse(ok);
  const Value* value = file.find("nested");
  for (int level = 1; level < 8; ++level) {
    const auto& array = std::get<Array>(value->data);
    ASSERT_EQ(array.elem_type, ValueType::kArray);
    ASSERT_EQ(array.items.size(), 1u);
    value = &array.items[0];
  }
  EXPECT_EQ(std::get<Array>(value->data).items, (std::vector<Value>{Value{uint8_t{42}}}));

  EXPECT_THAT(parse_error(nested_arrays(9).bytes()),
              HasSubstr("is nested 9 deep (at most 8 levels of arrays)"));
  // Deep enough to exhaust the stack if depth were unchecked.
  EXPECT_THAT(parse_error(nested_arrays(1000000).bytes()), HasSubstr("nested 9 deep"));
}

TEST(GgufReader, EmptyFileWithoutTensors) {
  const auto bytes = RawGguf().header(0, 0).bytes();
  const File file = File::parse(bytes);
  EXPECT_TRUE(file.metadata().empty());
  EXPECT_TRUE(file.tensors().empty());
  // The data section would start past the end; that only matters if a tensor is there.
  EXPECT_THAT(parse_error(RawGguf().header(1, 0).tensor("t", {0}, TensorType::kF32, 0).bytes()),
              HasSubstr("tensor 't'"));
}

TEST(GgufReader, NamesInErrorsAreEscapedAndCut) {
  auto bad_key = [](std::string_view key) {
    return RawGguf().header(0, 1).str(key).u32(77).bytes();  // unknown value type
  };
  EXPECT_THAT(parse_error(bad_key("a\x1b[2J\nb\\c")),
              HasSubstr("metadata key 'a\\x1b[2J\\x0ab\\x5cc'"));
  const std::string message = parse_error(bad_key(std::string(1000, 'k')));
  EXPECT_THAT(message, HasSubstr("'" + std::string(96, 'k') + "... (1000 bytes)'"));
  EXPECT_LT(message.size(), 300u);
}

// ---- Random corruption -----------------------------------------------------------------------

// Exercises a successfully parsed file the way a loader would.
void touch_everything(const File& file) {
  for (const KeyValue& kv : file.metadata()) {
    EXPECT_EQ(file.find(kv.key), &kv.value);
    try {
      file.get_u64(kv.key);
    } catch (const FormatError&) {
    }
    try {
      file.get_i32_array(kv.key);
    } catch (const FormatError&) {
    }
  }
  for (const TensorInfo& tensor : file.tensors()) {
    const auto data = file.tensor_data(tensor);
    EXPECT_EQ(data.size(), tensor.num_bytes);
    if (!data.empty()) {
      volatile uint8_t last = data.back();  // in bounds, or ASan says otherwise
      (void)last;
    }
  }
}

TEST(GgufReader, RandomHeaderCorruptionNeverCrashes) {
  auto bytes = stories_bytes();
  std::mt19937_64 rng(1234);
  std::uniform_int_distribution<size_t> position(0, kStoriesDataStart - 1);
  int num_parsed = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::pair<size_t, uint8_t>> saved;
    const int num_flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < num_flips; ++i) {
      const size_t at = position(rng);
      saved.emplace_back(at, bytes[at]);
      bytes[at] = static_cast<uint8_t>(rng() % 4 == 0 ? 0xFF : rng());
    }
    try {
      touch_everything(File::parse(bytes));
      ++num_parsed;
    } catch (const FormatError&) {
    }
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) bytes[it->first] = it->second;
  }
  EXPECT_GT(num_parsed, 0);  // some flips land in values and strings
}

// ---- Type table ------------------------------------------------------------------------------

TEST(GgufTypes, BlockLayouts) {
  struct Layout {
    TensorType type;
    const char* name;
    uint64_t block_size;
    uint64_t type_size;
  };
  const Layout layouts[] = {
      {TensorType::kF32, "F32", 1, 4},           {TensorType::kF16, "F16", 1, 2},
      {TensorType::kBF16, "BF16", 1, 2},         {TensorType::kQ8_0, "Q8_0", 32, 34},
      {TensorType::kQ4_0, "Q4_0", 32, 18},       {TensorType::kQ4_1, "Q4_1", 32, 20},
      {TensorType::kQ5_0, "Q5_0", 32, 22},       {TensorType::kQ5_1, "Q5_1", 32, 24},
      {TensorType::kQ8_1, "Q8_1", 32, 36},       {TensorType::kQ2_K, "Q2_K", 256, 84},
      {TensorType::kQ3_K, "Q3_K", 256, 110},     {TensorType::kQ4_K, "Q4_K", 256, 144},
      {TensorType::kQ5_K, "Q5_K", 256, 176},     {TensorType::kQ6_K, "Q6_K", 256, 210},
      {TensorType::kQ8_K, "Q8_K", 256, 292},     {TensorType::kIQ2_XXS, "IQ2_XXS", 256, 66},
      {TensorType::kIQ2_XS, "IQ2_XS", 256, 74},  {TensorType::kIQ3_XXS, "IQ3_XXS", 256, 98},
      {TensorType::kIQ1_S, "IQ1_S", 256, 50},    {TensorType::kIQ4_NL, "IQ4_NL", 32, 18},
      {TensorType::kIQ3_S, "IQ3_S", 256, 110},   {TensorType::kIQ2_S, "IQ2_S", 256, 82},
      {TensorType::kIQ4_XS, "IQ4_XS", 256, 136}, {TensorType::kI8, "I8", 1, 1},
      {TensorType::kI16, "I16", 1, 2},           {TensorType::kI32, "I32", 1, 4},
      {TensorType::kI64, "I64", 1, 8},           {TensorType::kF64, "F64", 1, 8},
      {TensorType::kIQ1_M, "IQ1_M", 256, 56},    {TensorType::kTQ1_0, "TQ1_0", 256, 54},
      {TensorType::kTQ2_0, "TQ2_0", 256, 66},    {TensorType::kMXFP4, "MXFP4", 32, 17},
  };
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    EXPECT_EQ(to_string(layout.type), layout.name);
    EXPECT_EQ(block_size(layout.type), layout.block_size);
    EXPECT_EQ(type_size(layout.type), layout.type_size);
  }
  for (TensorType type :
       {TensorType::kF32, TensorType::kF16, TensorType::kBF16, TensorType::kQ8_0, TensorType::kQ4_0,
        TensorType::kQ4_1, TensorType::kQ5_0, TensorType::kQ5_1, TensorType::kIQ4_NL,
        TensorType::kQ2_K, TensorType::kQ3_K, TensorType::kQ4_K, TensorType::kQ5_K,
        TensorType::kQ6_K, TensorType::kIQ4_XS}) {
    EXPECT_TRUE(is_supported(type)) << to_string(type);
  }
  for (TensorType type :
       {TensorType::kQ8_K, TensorType::kIQ2_XXS, TensorType::kIQ1_S, TensorType::kTQ1_0,
        TensorType::kTQ2_0, TensorType::kMXFP4, TensorType::kI32}) {
    EXPECT_FALSE(is_supported(type)) << to_string(type);
  }
  const auto unknown = static_cast<TensorType>(99);
  EXPECT_EQ(to_string(unknown), "type 99");
  EXPECT_FALSE(is_supported(unknown));
  EXPECT_THROW(block_size(unknown), FormatError);
  EXPECT_THROW(type_size(static_cast<TensorType>(4)), FormatError);  // removed Q4_2
}

TEST(GgufTypes, TensorNumBytes) {
  const std::vector<uint64_t> matrix = {64, 3};
  EXPECT_EQ(tensor_num_bytes(TensorType::kF32, matrix), 64u * 3 * 4);
  EXPECT_EQ(tensor_num_bytes(TensorType::kQ8_0, matrix), 2u * 3 * 34);
  EXPECT_EQ(tensor_num_bytes(TensorType::kQ4_0, matrix), 2u * 3 * 18);
  EXPECT_EQ(tensor_num_bytes(TensorType::kQ6_K, std::vector<uint64_t>{512, 2, 1, 3}), 2u * 6 * 210);
  EXPECT_THROW(tensor_num_bytes(TensorType::kF32, std::vector<uint64_t>{}), FormatError);
  EXPECT_THROW(tensor_num_bytes(TensorType::kF32, std::vector<uint64_t>{1, 1, 1, 1, 1}),
               FormatError);
  EXPECT_THROW(tensor_num_bytes(TensorType::kQ8_0, std::vector<uint64_t>{33}), FormatError);
  EXPECT_EQ(to_string(ValueType::kFloat32), "float32");
  EXPECT_EQ(to_string(static_cast<ValueType>(13)), "unknown");
}

}  // namespace
}  // namespace sieve::gguf
