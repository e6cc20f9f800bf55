#include "hf/generation_config.h"

#include <filesystem>
#include <limits>

#include "hf/json_file.h"
#include "util/error.h"

namespace sieve::hf {

namespace {

using nlohmann::json;

const json* field(const json& config, const char* name) {
  auto it = config.find(name);
  return it == config.end() || it->is_null() ? nullptr : &*it;
}

std::optional<float> number(const json& config, const char* name, const std::string& path,
                            double min, double max) {
  const json* v = field(config, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) fail("{}: '{}' must be a number, got {}", path, name, v->type_name());
  const double x = v->get<double>();
  if (!(x >= min && x <= max)) fail("{}: '{}' = {} is outside [{}, {}]", path, name, x, min, max);
  return static_cast<float>(x);
}

std::optional<int32_t> integer(const json& config, const char* name, const std::string& path,
                               int64_t min) {
  const json* v = field(config, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) fail("{}: '{}' must be an integer, got {}", path, name, v->dump());
  const int64_t x = v->get<int64_t>();
  if (x < min || x > std::numeric_limits<int32_t>::max())
    fail("{}: '{}' = {} is out of range", path, name, x);
  return static_cast<int32_t>(x);
}

// eos_token_id: one id or a list of them.
std::vector<int32_t> eos_token_ids(const json& config, const std::string& path) {
  std::vector<int32_t> out;
  if (const json* eos = field(config, "eos_token_id")) {
    const json ids = eos->is_array() ? *eos : json::array({*eos});
    for (const json& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max())
        fail("{}: 'eos_token_id' must be a token id or a list of them, got {}", path, eos->dump());
      out.push_back(id.get<int32_t>());
    }
  }
  return out;
}

}  // namespace

GenerationConfig read_generation_config(const std::string& path) {
  const json config = read_json_file(path);
  if (!config.is_object()) fail("{}: expected a JSON object", path);
  GenerationConfig out;
  out.temperature = number(config, "temperature", path, 0.0, 1e4);
  out.top_p = number(config, "top_p", path, 0.0, 1.0);
  // HF's "no top-k" is 0 (and some files write -1, as vLLM takes it).
  if (std::optional<int32_t> k = integer(config, "top_k", path, -1); k && *k > 0) out.top_k = k;
  out.min_p = number(config, "min_p", path, 0.0, 1.0);
  out.repetition_penalty = number(config, "repetition_penalty", path, 1e-6, 1e4);
  out.max_new_tokens = integer(config, "max_new_tokens", path, 1);
  out.eos_token_ids = eos_token_ids(config, path);
  return out;
}

std::optional<std::string> find_generation_config(const std::string& folder) {
  const std::filesystem::path path = std::filesystem::path(folder) / "generation_config.json";
  if (!std::filesystem::is_regular_file(path)) return std::nullopt;
  return path.string();
}

std::optional<std::pair<std::string, GenerationConfig>> read_folder_generation_config(
    const std::string& folder) {
  if (const std::optional<std::string> path = find_generation_config(folder))
    return std::pair(*path, read_generation_config(*path));
  const std::string config_path = (std::filesystem::path(folder) / "config.json").string();
  if (!std::filesystem::is_regular_file(config_path)) return std::nullopt;
  const json config = read_json_file(config_path);
  if (!config.is_object()) fail("{}: expected a JSON object", config_path);
  GenerationConfig out;
  out.eos_token_ids = eos_token_ids(config, config_path);
  if (out.empty()) return std::nullopt;
  return std::pair(config_path, std::move(out));
}

}  // namespace sieve::hf
