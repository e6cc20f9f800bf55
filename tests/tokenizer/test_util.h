#pragma once
// Helpers shared by the tokenizer tests: loading the shared vocabularies and golden cases.
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "shared_data.h"
#include "tokenizer/tokenizer.h"

namespace sieve::tok::testing {

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// shared/golden/tokenizer/ggml-vocab-<name>.gguf
inline std::string golden_vocab_path(const std::string& name) {
  return sieve::testing::shared_path("golden/tokenizer/ggml-vocab-" + name + ".gguf");
}

inline Vocab load_gguf_vocab(const std::string& path) {
  const gguf::File file = gguf::File::open(path);
  return load_vocab(file);
}

// One tokenizer per vocabulary, built once per test binary (building them parses ~100k merges).
inline const Tokenizer& golden_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) slot = Tokenizer::create(load_gguf_vocab(golden_vocab_path(name)));
  return *slot;
}

struct GoldenCase {
  std::string text;
  std::vector<TokenId> ids;
};

// The .inp/.out pairs (format in shared/golden/tokenizer/README.md).
inline std::vector<GoldenCase> read_golden_cases(const std::string& name) {
  const std::string vocab = golden_vocab_path(name);
  const std::string inp = read_file(vocab + ".inp");
  const std::string out = read_file(vocab + ".out");
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  while (pos < inp.size()) {
    size_t hit = inp.find(separator, pos);
    if (hit == std::string::npos) throw std::runtime_error(".inp does not end with a separator");
    texts.push_back(inp.substr(pos, hit - pos));
    pos = hit + separator.size();
  }
  std::vector<GoldenCase> cases;
  std::istringstream lines(out);
  std::string line;
  for (const std::string& text : texts) {
    if (!std::getline(lines, line)) throw std::runtime_error(".out has fewer lines than .inp");
    GoldenCase c{text, {}};
    std::istringstream ids(line);
    int64_t id = 0;
    while (ids >> id) c.ids.push_back(static_cast<TokenId>(id));
    cases.push_back(std::move(c));
  }
  return cases;
}

// Printable form of a test string for failure messages.
inline std::string escaped(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else
      out += static_cast<char>(c);
  }
  return out;
}

}  // namespace sieve::tok::testing
