#pragma once
// The needle tests' shared model and haystack: copy-lm (context 1024) and its held-out text,
// loaded once per test suite.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "model/loader.h"
#include "shared_data.h"

namespace sieve::eval {

class CopyLmTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    loaded_ = std::make_unique<model::LoadedModel>(
        model::load_model({sieve::testing::shared_path("models/copy/copy-lm.gguf"), ""}));
    std::ifstream in(sieve::testing::shared_path("models/copy/heldout.txt"));
    std::stringstream text;
    text << in.rdbuf();
    text_ = std::make_unique<std::string>(text.str());
  }
  static void TearDownTestSuite() {
    loaded_.reset();
    text_.reset();
  }

  static inline std::unique_ptr<model::LoadedModel> loaded_;
  static inline std::unique_ptr<std::string> text_;
};

}  // namespace sieve::eval
