// Tokenizer speed on the shared llama.cpp reference vocabularies: encode throughput on 80 KB of
// mixed text, and how the time grows when long inputs (one long word, runs of whitespace)
// double: ~2x is linear, ~4x quadratic. A plain program printing ratios measured in the same run
// (the tests check only that these inputs round-trip).
//   build/bench/tokenizer_bench [SHARED_DIR]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

using sieve::tok::EncodeOptions;
using sieve::tok::Tokenizer;

constexpr EncodeOptions kPlain{.add_special = false, .parse_special = false};

// Best of 3, in seconds.
double encode_seconds(const Tokenizer& tokenizer, const std::string& text) {
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const auto ids = tokenizer.encode(text, kPlain);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (ids.empty()) return -1;
    best = std::min(best, s);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const std::filesystem::path shared = argc > 1 ? argv[1] : SIEVE_SHARED_DIR;
  const std::filesystem::path dir = shared / "golden" / "tokenizer";
  std::vector<std::filesystem::path> vocabs;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".gguf") vocabs.push_back(entry.path());
  }
  if (vocabs.empty()) {
    std::fprintf(stderr, "tokenizer_bench: no vocabularies in %s\n", dir.c_str());
    return 1;
  }
  std::sort(vocabs.begin(), vocabs.end());
  std::printf("%-28s %12s %10s | time(2n) / time(n): %8s %8s %8s\n", "vocabulary", "80KB MB/s",
              "tokens", "'a'*n", "' '*n", "'\\n'*n");
  for (const auto& path : vocabs) {
    const auto tokenizer =
        Tokenizer::create(sieve::tok::load_vocab(sieve::gguf::File::open(path.string())));
    std::ifstream in(path.string() + ".inp");
    std::stringstream buffer;
    buffer << in.rdbuf();
    std::string text;
    while (text.size() < 80 * 1024) text += buffer.str() + "\n";
    const double s = encode_seconds(*tokenizer, text);
    const size_t tokens = tokenizer->encode(text, kPlain).size();
    double ratios[3];
    const char fills[3] = {'a', ' ', '\n'};
    for (int k = 0; k < 3; ++k) {
      const size_t n = 30000;
      ratios[k] = encode_seconds(*tokenizer, std::string(2 * n, fills[k]) + "1") /
                  encode_seconds(*tokenizer, std::string(n, fills[k]) + "1");
    }
    std::printf("%-28s %12.1f %10zu | %29.2f %8.2f %8.2f\n", path.filename().c_str(),
                text.size() / s / 1e6, tokens, ratios[0], ratios[1], ratios[2]);
  }
  return 0;
}
