#include "server/request_fields.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace sieve::server {

const json* field(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

double number_of(const json& value, const std::string& param) {
  if (!value.is_number()) throw_invalid(param, fmt::format("'{}' must be a number", param));
  const double x = value.get<double>();
  if (!std::isfinite(x)) throw_invalid(param, fmt::format("'{}' must be a finite number", param));
  return x;
}

int64_t integer_of(const json& value, const std::string& param) {
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw_invalid(param, fmt::format("'{}' is too large", param));
    }
    return static_cast<int64_t>(value.get<uint64_t>());
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    // 16.0 is accepted as 16 (as pydantic does); 16.5 is not.
    const double x = value.get<double>();
    if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) <= 9007199254740992.0)
      return static_cast<int64_t>(x);
  }
  throw_invalid(param, fmt::format("'{}' must be an integer", param));
}

int64_t integer_in(const json& value, int64_t lo, int64_t hi, const std::string& param) {
  const int64_t x = integer_of(value, param);
  if (x < lo || x > hi)
    throw_invalid(param, fmt::format("'{}' must be in [{}, {}], got {}", param, lo, hi, x));
  return x;
}

int32_t int32_of(const json& value, const std::string& param) {
  return static_cast<int32_t>(integer_in(value, std::numeric_limits<int32_t>::min(),
                                         std::numeric_limits<int32_t>::max(), param));
}

bool bool_of(const json& value, const std::string& param) {
  if (!value.is_boolean()) throw_invalid(param, fmt::format("'{}' must be a boolean", param));
  return value.get<bool>();
}

std::string string_of(const json& value, const std::string& param) {
  if (!value.is_string()) throw_invalid(param, fmt::format("'{}' must be a string", param));
  return value.get<std::string>();
}

tok::TokenId token_id_of(const json& value, const std::string& param, size_t vocab_size) {
  const int64_t id = integer_of(value, param);
  if (id < 0 || id >= static_cast<int64_t>(vocab_size)) {
    throw_invalid(param, fmt::format("token id {} in '{}' is outside the vocabulary (0..{})", id,
                                     param, vocab_size - 1));
  }
  return static_cast<tok::TokenId>(id);
}

std::vector<tok::TokenId> token_array(const json& array, const std::string& param,
                                      size_t vocab_size) {
  std::vector<tok::TokenId> ids;
  ids.reserve(array.size());
  for (const json& v : array) ids.push_back(token_id_of(v, param, vocab_size));
  return ids;
}

}  // namespace sieve::server
