// Calibration profile: JSON (nlohmann) <-> CalibrationProfile, and files.
#include "sparsity/calibration.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "util/error.h"

namespace sieve::sparsity {

namespace {

using Json = nlohmann::json;

constexpr std::string_view kFormat = "sieve-calibration";
constexpr int64_t kVersion = 1;

const Json& field(const Json& object, std::string_view key) {
  const auto it = object.find(key);
  if (it == object.end()) fail("calibration profile: missing \"{}\"", key);
  return *it;
}

std::string string_field(const Json& object, std::string_view key) {
  const Json& value = field(object, key);
  if (!value.is_string()) fail("calibration profile: \"{}\" must be a string", key);
  return value.get<std::string>();
}

int64_t int_field(const Json& object, std::string_view key) {
  const Json& value = field(object, key);
  if (!value.is_number_integer()) fail("calibration profile: \"{}\" must be an integer", key);
  return value.get<int64_t>();
}

}  // namespace

void validate(const CalibrationProfile& profile) {
  if (profile.model_name.empty()) fail("calibration profile: empty model name");
  if (profile.model_fingerprint.empty()) fail("calibration profile: empty model fingerprint");
  if (profile.num_layers <= 0 || profile.num_kv_heads <= 0 || profile.num_layers > (1 << 16) ||
      profile.num_kv_heads > (1 << 16)) {
    fail("calibration profile: bad shape {} layers x {} KV heads", profile.num_layers,
         profile.num_kv_heads);
  }
  if (profile.num_samples < 0) fail("calibration profile: negative num_samples");
  const auto expected = static_cast<size_t>(profile.num_layers * profile.num_kv_heads);
  if (profile.streaming_scores.size() != expected) {
    fail("calibration profile: {} streaming scores for {} layers x {} KV heads",
         profile.streaming_scores.size(), profile.num_layers, profile.num_kv_heads);
  }
  for (size_t i = 0; i < expected; ++i) {
    const double s = profile.streaming_scores[i];
    if (!(s >= 0.0 && s <= 1.0)) {
      fail("calibration profile: streaming score of layer {} KV head {} is {}, not in [0, 1]",
           static_cast<int64_t>(i) / profile.num_kv_heads,
           static_cast<int64_t>(i) % profile.num_kv_heads, s);
    }
  }
}

CalibrationProfile parse_calibration(std::string_view json_text) {
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::exception& e) {
    fail("calibration profile: not valid JSON: {}", e.what());
  }
  if (!root.is_object()) fail("calibration profile: expected a JSON object");
  if (string_field(root, "format") != kFormat) {
    fail("calibration profile: \"format\" must be \"{}\"", kFormat);
  }
  if (const int64_t version = int_field(root, "version"); version != kVersion) {
    fail("calibration profile: version {} is not supported (this build reads {})", version,
         kVersion);
  }
  const Json& model = field(root, "model");
  if (!model.is_object()) fail("calibration profile: \"model\" must be an object");
  CalibrationProfile profile;
  profile.model_name = string_field(model, "name");
  profile.model_fingerprint = string_field(model, "fingerprint");
  profile.num_layers = int_field(root, "num_layers");
  profile.num_kv_heads = int_field(root, "num_kv_heads");
  if (root.contains("method")) profile.method = string_field(root, "method");
  if (root.contains("num_samples")) profile.num_samples = int_field(root, "num_samples");
  const Json& scores = field(root, "streaming_scores");
  if (!scores.is_array() || static_cast<int64_t>(scores.size()) != profile.num_layers) {
    fail("calibration profile: \"streaming_scores\" must be an array of num_layers ({}) arrays",
         profile.num_layers);
  }
  for (size_t l = 0; l < scores.size(); ++l) {
    const Json& row = scores[l];
    if (!row.is_array() || static_cast<int64_t>(row.size()) != profile.num_kv_heads) {
      fail(
          "calibration profile: streaming_scores[{}] must be an array of num_kv_heads ({}) "
          "numbers",
          l, profile.num_kv_heads);
    }
    for (const Json& s : row) {
      if (!s.is_number()) fail("calibration profile: streaming_scores[{}] holds a non-number", l);
      profile.streaming_scores.push_back(s.get<double>());
    }
  }
  validate(profile);
  return profile;
}

std::string to_json(const CalibrationProfile& profile) {
  validate(profile);
  Json scores = Json::array();
  for (int64_t l = 0; l < profile.num_layers; ++l) {
    Json row = Json::array();
    for (int64_t h = 0; h < profile.num_kv_heads; ++h) row.push_back(profile.score(l, h));
    scores.push_back(std::move(row));
  }
  Json root = {
      {"format", kFormat},
      {"version", kVersion},
      {"model", {{"name", profile.model_name}, {"fingerprint", profile.model_fingerprint}}},
      {"num_layers", profile.num_layers},
      {"num_kv_heads", profile.num_kv_heads}};
  if (!profile.method.empty()) root["method"] = profile.method;
  if (profile.num_samples > 0) root["num_samples"] = profile.num_samples;
  root["streaming_scores"] = std::move(scores);
  return root.dump(2) + "\n";
}

CalibrationProfile load_calibration(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open calibration profile {}", path);
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return parse_calibration(text.str());
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
}

void save_calibration(const CalibrationProfile& profile, const std::string& path) {
  const std::string text = to_json(profile);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("cannot write calibration profile {}", path);
  out << text;
  out.close();
  if (!out) fail("error writing calibration profile {}", path);
}

}  // namespace sieve::sparsity
