// Calibration profile files: save/load round trip, the documented JSON layout, and errors
// that name the field.
#include "sparsity/calibration.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "error_of.h"
#include "util/error.h"

namespace sieve::sparsity {
namespace {

using sieve::testing::error_of;

CalibrationProfile sample_profile() {
  CalibrationProfile p;
  p.model_name = "stories260K";
  p.model_fingerprint = "5a9d168b";
  p.num_layers = 2;
  p.num_kv_heads = 3;
  p.method = "sink+window mass, S=4, W=32";
  p.num_samples = 7;
  p.streaming_scores = {0.1, 0.25, 1.0 / 3.0, 0.0, 1.0, 0.123456789012345};
  return p;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "." + std::to_string(::getpid()) + ".json"))
      .string();
}

TEST(Calibration, SaveLoadRoundTripsExactly) {
  const CalibrationProfile profile = sample_profile();
  const std::string path = temp_path("sieve_calibration_test");
  save_calibration(profile, path);
  EXPECT_EQ(load_calibration(path), profile);
  // The file is the documented layout.
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["format"], "sieve-calibration");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["model"]["name"], "stories260K");
  EXPECT_EQ(j["streaming_scores"].size(), 2u);
  EXPECT_EQ(j["streaming_scores"][1].size(), 3u);
  EXPECT_DOUBLE_EQ(j["streaming_scores"][1][1].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(profile.score(1, 2), 0.123456789012345);
  std::remove(path.c_str());
  // Optional fields may be absent.
  CalibrationProfile minimal = profile;
  minimal.method.clear();
  minimal.num_samples = 0;
  EXPECT_EQ(parse_calibration(to_json(minimal)), minimal);
}

TEST(Calibration, ErrorsNameTheField) {
  const nlohmann::json good = nlohmann::json::parse(to_json(sample_profile()));
  const auto with = [&](auto edit) {
    nlohmann::json j = good;
    edit(j);
    return error_of([&] { parse_calibration(j.dump()); });
  };
  EXPECT_NE(error_of([] { parse_calibration("{"); }).find("not valid JSON"), std::string::npos);
  EXPECT_NE(with([](auto& j) { j["format"] = "other"; }).find("\"format\" must be"),
            std::string::npos);
  EXPECT_NE(with([](auto& j) { j["version"] = 2; }).find("version 2 is not supported"),
            std::string::npos);
  EXPECT_NE(with([](auto& j) { j.erase("model"); }).find("missing \"model\""), std::string::npos);
  EXPECT_NE(with([](auto& j) { j["model"]["fingerprint"] = ""; }).find("empty model fingerprint"),
            std::string::npos);
  EXPECT_NE(with([](auto& j) { j["num_layers"] = 3; }).find("array of num_layers (3) arrays"),
            std::string::npos);
  EXPECT_NE(
      with([](auto& j) { j["num_kv_heads"] = "3"; }).find("\"num_kv_heads\" must be an integer"),
      std::string::npos);
  EXPECT_NE(with([](auto& j) {
              j["streaming_scores"][0].push_back(0.5);
            }).find("streaming_scores[0] must be an array of num_kv_heads (3)"),
            std::string::npos);
  EXPECT_NE(with([](auto& j) {
              j["streaming_scores"][1][2] = 1.5;
            }).find("layer 1 KV head 2 is 1.5, not in [0, 1]"),
            std::string::npos);
  EXPECT_NE(with([](auto& j) { j["streaming_scores"][0][0] = "x"; }).find("non-number"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              load_calibration("/nonexistent/profile.json");
            }).find("cannot open calibration profile /nonexistent/profile.json"),
            std::string::npos);
  CalibrationProfile bad = sample_profile();
  bad.streaming_scores.pop_back();
  EXPECT_NE(error_of([&] { to_json(bad); }).find("5 streaming scores for 2 layers x 3 KV heads"),
            std::string::npos);
}

}  // namespace
}  // namespace sieve::sparsity
